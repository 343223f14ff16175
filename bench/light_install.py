"""What the light install costs: `pip install` of this checkout with no extras into a fresh venv.

    python bench/light_install.py [--no-kernels] [--runs 7] [--json FILE]

Reports the venv's size (and what the install added to a bare venv's pip and setuptools), the
install's wall time, and the start-up of `batchproof probe --help`: its median wall time over
--runs against a bare `python -c pass`, and the import time Python itself counts (-X importtime).
--no-kernels installs with a compiler that fails (CC=false), as on a machine without one: the
engine's C kernels, which the probe never loads, are then not built (over a minute on 2 cores).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def size_bytes(path: Path) -> int:
    """As `du` counts it: the blocks the files take on disk."""
    return sum(f.lstat().st_blocks * 512 for f in path.rglob("*"))


def median_wall_s(command: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def import_time_s(python: Path) -> float:
    """The sum of Python's own per-module import times for `batchproof probe --help`."""
    result = subprocess.run([str(python), "-X", "importtime", "-m", "batchproof", "probe", "--help"],
                            check=True, capture_output=True, text=True)
    rows = [line.split("|") for line in result.stderr.splitlines() if line.startswith("import time:")]
    return sum(int(row[0].split(":")[1]) for row in rows if row[0].split(":")[1].strip().isdigit()) / 1e6


def measure(workdir: Path, has_kernels: bool, runs: int) -> dict:
    checkout = workdir / "checkout"
    checkout.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, checkout / name)
    shutil.copytree(ROOT / "src", checkout / "src", ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info"))
    env_dir = workdir / "venv"
    venv.create(env_dir, with_pip=True)
    bare = size_bytes(env_dir)
    python, started = env_dir / "bin" / "python", time.perf_counter()
    env = os.environ if has_kernels else {**os.environ, "CC": "false"}
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(checkout)], check=True, env=env)
    install_s = time.perf_counter() - started
    kernels = list((env_dir / "lib").rglob("_kernels*.so"))
    return {
        "venv_mb": round(size_bytes(env_dir) / 2**20, 1),
        "added_to_bare_venv_mb": round((size_bytes(env_dir) - bare) / 2**20, 1),
        "kernels_mb": round(kernels[0].stat().st_size / 2**20, 1) if kernels else None,
        "install_s": round(install_s, 1),
        "probe_help_wall_s": round(median_wall_s([str(env_dir / "bin" / "batchproof"), "probe", "--help"], runs), 3),
        "python_pass_wall_s": round(median_wall_s([str(python), "-c", "pass"], runs), 3),
        "probe_help_import_s": round(import_time_s(python), 3),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-kernels", action="store_true", help="install as on a machine without a compiler")
    parser.add_argument("--runs", type=int, default=7, help="runs of `batchproof probe --help` (the median)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="batchproof-light-") as workdir:
        figures = measure(Path(workdir), not args.no_kernels, args.runs)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
