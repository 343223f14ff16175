"""What a decode step's matmuls cost at n rows, relative to one row: the default model's shapes
(30 layers of Q4_1 QKV, output, gate+up and down, and the Q8_0 LM head), random blocks, in one
numerics at one instruction-set level. The shape of this curve decides two things: the seed's S7
(a step of 4 rows must cost under twice a step of one) and which drafts pay (the speculative
cost table, src/batchproof/engine/draft/cost.py). Run on a quiet machine:

    python bench/step_cost.py [--numerics int8] [--max-isa avx2] [--threads 2] [--json OUT]
"""

import argparse
import json
import statistics
import time

import gguf
import numpy as np
import torch

from batchproof.engine.model.ops import kernels
from batchproof.engine.model.weights import RawTensor, quant_weight

Q = gguf.GGMLQuantizationType
# SmolLM2-135M: dim 576, 9 query and 3 KV heads of 64, ffn 1536, vocabulary 49,152
LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
NUM_LAYERS, VOCAB, DIM = 30, 49152, 576
ROWS = (1, 2, 3, 4, 5, 6, 8, 12, 16)


def random_blocks(rng: np.random.Generator, qtype: Q, rows: int, k: int) -> np.ndarray:
    """Random quants under a small float16 scale (and Q4_1's min): only speed means anything."""
    elems, size = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, (rows, k // elems * size), dtype=np.uint8)
    blocks = data.reshape(rows, k // elems, size)
    blocks[:, :, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    if qtype == Q.Q4_1:
        blocks[:, :, 2:4] = np.frombuffer(np.float16(-0.05).tobytes(), np.uint8)
    return data


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--numerics", default="float32", choices=["float32", "int8"])
    parser.add_argument("--max-isa", default="avx512", choices=list(kernels.ISA_LEVELS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    kernels.cap_isa_level(kernels.ISA_LEVELS[args.max_isa])
    rng = np.random.default_rng(0)
    hold = kernels.int8_weight if args.numerics == "int8" else quant_weight
    linear = kernels.linear_q_int8 if args.numerics == "int8" else kernels.linear_q
    weights = [hold(RawTensor(random_blocks(rng, Q.Q4_1, n, k), int(Q.Q4_1), (n, k))) for n, k in LAYER_SHAPES]
    head = hold(RawTensor(random_blocks(rng, Q.Q8_0, VOCAB, DIM), int(Q.Q8_0), (VOCAB, DIM)))

    def step(xs: dict[int, torch.Tensor]) -> None:
        for _ in range(NUM_LAYERS):
            for w in weights:
                linear(xs[w.shape[1]], w, None, args.threads)
        linear(xs[DIM], head, None, args.threads)

    ms = {}
    for m in ROWS:
        xs = {k: torch.randn(m, k) for k in {DIM, 1536}}
        step(xs)
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            step(xs)
            times.append(time.perf_counter() - started)
        ms[m] = statistics.median(times) * 1e3
    level = kernels.ISA_NAMES[kernels.isa_level()]
    result = {"numerics": args.numerics, "level": level, "threads": args.threads, "one_row_ms": round(ms[1], 3),
              "relative": {m: round(ms[m] / ms[1], 2) for m in ROWS}}
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
