"""Q4_1 with 8 weight rows interleaved (bench/interleaved_q4_1.c) against the library's
register path, one to four rows of x, on the default model's matmul shapes: the outputs compared bit
for bit, then both timed alternately in one process (best of 12). An experiment toward a
faster single stream (docs/batch-invariance.md); the package does not use this layout.

    python setup.py build_ext --inplace && python bench/interleaved_q4_1.py [--threads 2]
"""

import argparse
import ctypes
import subprocess
import sys
import tempfile
import time
from ctypes import c_int, c_int64, c_void_p
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from batchproof.engine.model.ops.abi import load_library  # noqa: E402
from tests.helpers.quant_blocks import random_blocks  # noqa: E402

Q4_1 = int(GGMLQuantizationType.Q4_1)
SHAPES = [(3072, 576), (960, 576), (576, 1536), (576, 576)]  # gate/up, QKV, down, output
WEIGHTS_PER_SHAPE = 8  # distinct matrices per call, so the weights come from memory, as in a step


def compile_experiment(out_dir: str) -> ctypes.CDLL:
    so = Path(out_dir) / "interleaved_q4_1.so"
    subprocess.run(["gcc", "-O3", "-fopenmp", "-ffp-contract=off", "-fPIC", "-shared",
                    str(ROOT / "bench" / "interleaved_q4_1.c"), "-o", str(so)], check=True)
    lib = ctypes.CDLL(str(so))
    lib.repack.argtypes = [c_void_p, c_int64, c_int64, c_void_p]
    lib.linear_interleaved.argtypes = [c_void_p, c_int64, c_void_p, c_void_p, c_int64, c_int64, c_int]
    return lib


def compare(ours: ctypes.CDLL, exp: ctypes.CDLL, rows: int, n: int, k: int, threads: int) -> str:
    weights = [np.ascontiguousarray(random_blocks(GGMLQuantizationType.Q4_1, n, k, seed))
               for seed in range(WEIGHTS_PER_SHAPE)]
    packed = []
    for w in weights:
        p = np.empty(n // 8 * (k // 32) * 192, dtype=np.uint8)
        exp.repack(w.ctypes.data, n, k, p.ctypes.data)
        packed.append(p)
    x, y_lib, y_exp = torch.randn(rows, k), torch.empty(rows, n), torch.empty(rows, n)

    def library():
        for w in weights:
            ours.bp_linear_q(x.data_ptr(), w.ctypes.data, Q4_1, w.shape[1], None, y_lib.data_ptr(), n, rows, n, k,
                             0, threads)

    def interleaved():
        for p in packed:
            exp.linear_interleaved(x.data_ptr(), rows, p.ctypes.data, y_exp.data_ptr(), n, k, threads)

    library(), interleaved()
    best = {"library": float("inf"), "interleaved": float("inf")}
    for _ in range(12):
        for name, fn in (("library", library), ("interleaved", interleaved)):
            started = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - started)
    return (f"{rows} row(s), {n}x{k}: bits equal {torch.equal(y_lib, y_exp)}; library {best['library'] * 1e3:.3f} ms, "
            f"interleaved {best['interleaved'] * 1e3:.3f} ms, {best['library'] / best['interleaved']:.2f}x "
            f"({WEIGHTS_PER_SHAPE} matrices, {threads} threads)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    ours = load_library()
    with tempfile.TemporaryDirectory() as tmp:
        exp = compile_experiment(tmp)
        for rows in range(1, 5):
            for n, k in SHAPES:
                print(compare(ours, exp, rows, n, k, args.threads))


if __name__ == "__main__":
    main()
