"""Issue 61: the same bits under two torch releases installed side by side. torch still holds the
tensors, but every float operation that decides a token or a logprob is ours (the sampler and its
draws, the normaliser, the RoPE tables: csrc/), so a seeded request must choose the same tokens,
and every logprob keep its bits, whichever torch the install accepted (pyproject: torch>=2.4).

    python bench/torch_releases.py VENV_A VENV_B [--isa avx2] [--torch-levels best,default] [--json FILE]

Each VENV is a virtual environment (or its python) with a torch and the serve extra's other
packages; this checkout's src/ goes first on its path, so both run the same code, each with its
own torch (the C kernels link only libc and libgomp, never torch, so one build serves both). For
every torch capability asked (best: what torch picks on this CPU; default: its plain code, as on
an x86 host without AVX and, for torch's own code, an ARM one), each venv runs
tests/engine/host_worker.py in a process of its own: both packaged models, both numerics, greedy
and seeded requests with penalties, logit_bias, top-k, top-p and min-p, top-20, tail and prompt
logprobs. Every token and every logprob's bits are compared. Exit status 1 on any difference."""

import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCH_INFO = ("import json, torch; print(json.dumps({'version': torch.__version__, 'file': torch.__file__, "
              "'capability': torch.backends.cpu.get_cpu_capability()}))")


def python_of(venv: str) -> str:
    path = Path(venv)
    python = path / "bin" / "python" if path.is_dir() else path
    if not python.exists():
        raise SystemExit(f"torch_releases: no python at {python} (give a venv directory or its python)")
    return str(python)


def environment(torch_level: str) -> dict[str, str]:
    """This checkout's code first on the path; torch's level set before it loads (unset: its best)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), "OMP_NUM_THREADS": "2"}
    env.pop("ATEN_CPU_CAPABILITY", None)
    if torch_level != "best":
        env["ATEN_CPU_CAPABILITY"] = torch_level
    return env


def last_json_line(command: list[str], env: dict[str, str]) -> dict:
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"torch_releases: {' '.join(command[:3])} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def packaged_runs() -> list[str]:
    from batchproof.engine.model.default_model import default_model_path
    from batchproof.engine.model.known_models import resolve_model

    models = [default_model_path(), resolve_model("gemma3-270m")]  # raises, naming the package, if absent
    return [f"{model}:{numerics}" for model in models for numerics in ("float32", "int8")]


def machine() -> dict:
    from batchproof.commands.bench import machine as described

    return described.describe()


def best_isa() -> str:
    from batchproof.engine.model.ops import kernels

    if not kernels.available():
        raise SystemExit("torch_releases: the kernels are not built (python setup.py build_ext --inplace)")
    return kernels.ISA_NAMES[kernels.isa_level()]


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def differences(reference: dict, got: dict) -> list[str]:
    """One line per (run, request) whose tokens or bits differ."""
    lines = []
    for run, requests in reference.items():
        for request_id, expected in requests.items():
            other = got.get(run, {}).get(request_id)
            if other != expected:
                tokens = "same tokens" if other and other["tokens"] == expected["tokens"] else "other tokens"
                lines.append(f"{Path(run).name} {request_id}: {tokens}, {digest(expected)} vs {digest(other)}")
    return lines


def compare(venvs: list[str], isa: str, torch_levels: list[str], runs: list[str]) -> dict:
    pythons = [python_of(v) for v in venvs]
    torches = [last_json_line([p, "-c", TORCH_INFO], environment("best")) for p in pythons]
    rows = []
    for level in torch_levels:
        reports = [last_json_line([p, "-m", "tests.engine.host_worker", isa, *runs], environment(level))
                   for p in pythons]
        records = [report["results"] for report in reports]
        rows.append({"torch_level": level, "torch_ran": [report["torch"] for report in reports],
                     "digests": [digest(r) for r in records],
                     "seeded_tokens": {run: records[0][run]["seeded"]["tokens"] for run in runs},
                     "differences": differences(records[0], records[1])})
    return {"date": datetime.date.today().isoformat(), "machine": machine(),
            "venvs": [{"python": p, "torch": t["version"], "torch_file": t["file"], "torch_best": t["capability"]}
                      for p, t in zip(pythons, torches)],
            "isa": isa, "runs": runs, "requests": sorted(records[0][runs[0]]), "levels": rows,
            "equal": not any(row["differences"] for row in rows)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("venvs", nargs=2, metavar="VENV", help="a virtual environment (or its python) with a torch")
    parser.add_argument("--isa", help="our kernels' cap (default: the best this CPU runs)")
    parser.add_argument("--torch-levels", default="best,default",
                        help="ATEN_CPU_CAPABILITY values to run at, 'best': torch's own pick (default: best,default)")
    parser.add_argument("--json", help="write the comparison here")
    args = parser.parse_args()
    result = compare(args.venvs, args.isa or best_isa(), [s.strip() for s in args.torch_levels.split(",")],
                     packaged_runs())
    for venv in result["venvs"]:
        print(f"torch {venv['torch']} ({venv['torch_best']} here): {venv['python']}")
    for row in result["levels"]:
        verdict = "equal" if not row["differences"] else f"{len(row['differences'])} differ"
        print(f"torch at {row['torch_level']}, ours at {result['isa']}: {len(result['runs'])} runs x "
              f"{len(result['requests'])} requests, digests {' / '.join(row['digests'])}: {verdict}")
        for line in row["differences"]:
            print(f"  {line}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
