"""`batchproof witness` N times in a row, as the README's proof runs it, and each run's S7 (issue
60's acceptance: ADMISSIBLE in 10 of 10 consecutive runs, every S7 recorded).

    python bench/witness_series.py --runs 10 --out bench/results/witness-series-zen2.json \
        [--label float32] [--serve-arg=--numerics=int8 ...]

Each run is a fresh `batchproof witness` (its own server, its own probe); the summary keeps the
verdict, S7 (c=4's per-request decode rate over c=1's), both rates, whether every band was
bitwise, and the check's reasons. Run it on a quiet machine: S7 is a ratio of two timings."""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from batchproof.commands.bench import machine


def s7(witness: dict) -> tuple[float | None, float | None, float | None]:
    rates = {band["c"]: band.get("decode_tok_s") for band in witness["bands"]}
    c1, c4 = rates.get(1), rates.get(4)
    return (c4 / c1 if c1 and c4 else None), c1, c4


def one_run(serve_args: list[str], directory: Path, index: int) -> dict:
    out = directory / f"witness-{index}.json"
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "batchproof", "witness", "--out", str(out),
                           *(f"--serve-arg={arg}" for arg in serve_args)], capture_output=True, text=True, check=False)
    witness = json.loads(out.read_text()) if out.exists() else None
    verdict = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr.strip()[-300:]
    if witness is None:
        return {"run": index, "exit_code": done.returncode, "verdict": verdict}
    ratio, c1, c4 = s7(witness)
    return {"run": index, "exit_code": done.returncode, "admissible": done.returncode == 0,
            "s7": None if ratio is None else round(ratio, 4), "c1_decode_tok_s": c1, "c4_decode_tok_s": c4,
            "every_band_bitwise": all(band.get("logprobs_bitwise_equal") for band in witness["bands"]),
            "results": {band["c"]: band["result"] for band in witness["bands"]}, "verdict": verdict,
            "seconds": round(time.time() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", required=True)
    parser.add_argument("--label", default="")
    parser.add_argument("--serve-arg", action="append", default=[])
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as directory:
        for index in range(1, args.runs + 1):
            runs.append(one_run(args.serve_arg, Path(directory), index))
            print(json.dumps(runs[-1]), flush=True)
    summary = {"label": args.label, "serve_args": args.serve_arg, "machine": machine.describe(), "runs": runs,
               "admissible": sum(bool(r.get("admissible")) for r in runs), "of": len(runs),
               "s7": [r.get("s7") for r in runs]}
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{args.label or 'defaults'}: ADMISSIBLE in {summary['admissible']} of {len(runs)}; S7 {summary['s7']}")


if __name__ == "__main__":
    main()
