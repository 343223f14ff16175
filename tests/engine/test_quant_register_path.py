"""One to four rows of x unpack Q4_K, Q5_K, Q6_K, Q5_0 and Q5_1 blocks in registers, straight
into the FMAs (quant_tiles_body.h and its twins), where more rows go through a buffer: two routes to one answer.

Each is held, on every instruction set here, to gguf.quants' dequantized weight: weight by
weight (rows of x that pick one weight each give back its exact float) and as a matmul (bit
for bit the float32 kernel over the dequantized weight), on blocks whose every scale is at
an edge: float16 subnormals, zeros of both signs, +-65504, 6-bit scales and mins of 0 and 63,
Q6_K's int8 scales of -128 and 127."""

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from batchproof.engine.model.ops import kernels
from batchproof.engine.model.weights import RawTensor, quant_weight
from tests.helpers.quant_blocks import SCALE_OFFSETS, bits, dequantized, random_blocks

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the kernels are not built here")

Q = GGMLQuantizationType
REGISTER_TYPES = [Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q5_0, Q.Q5_1, Q.Q4_0, Q.Q4_1, Q.Q8_0]
# float16 bit patterns: subnormals (the smallest, a middling one, the largest, the smallest
# negated), +0, -0, +-65504, and ordinary values with a full 11-bit significand.
EDGE_SCALES = np.array([0x0001, 0x0155, 0x03FF, 0x8001, 0x0000, 0x8000, 0x7BFF, 0xFBFF, 0x2BFF, 0xA7FF],
                       dtype=np.uint16)
K_SCALES = {Q.Q4_K: (4, 12), Q.Q5_K: (4, 12), Q.Q6_K: (192, 16)}  # the bytes of a K-quant's sub-block scales
EDGE_SUB_SCALES = {Q.Q4_K: [0x00, 0xFF, 0x3F, 0xC0], Q.Q5_K: [0x00, 0xFF, 0x3F, 0xC0],
                   Q.Q6_K: [0x80, 0x7F, 0x00, 0xFF, 0x81]}  # 6-bit 0 and 63 in every position; int8 edges


def edge_blocks(qtype: Q, rows: int, k: int, seed: int) -> RawTensor:
    """Random quants; row r's float16 scales EDGE_SCALES[r % 10] (d) and [r // 10 % 10] (the min),
    the sign flipping from block to block; a K-quant's sub-block scale bytes are, block by
    block, all of one edge pattern or random."""
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    blocks = random_blocks(qtype, rows, k, seed).reshape(rows, k // block_elems, block_bytes)
    row, block = np.arange(rows)[:, None], np.arange(k // block_elems)[None, :]
    for scale, offset in enumerate(SCALE_OFFSETS[qtype]):
        sign = np.where((block + scale) & 1, 0x8000, 0).astype(np.uint16)
        patterns = EDGE_SCALES[row // len(EDGE_SCALES) ** scale % len(EDGE_SCALES)] ^ sign
        blocks[:, :, offset:offset + 2] = patterns.view(np.uint8).reshape(rows, -1, 2)
    if qtype in K_SCALES:
        start, size = K_SCALES[qtype]
        for i, pattern in enumerate(EDGE_SUB_SCALES[qtype]):  # the rest stay random
            blocks[(row + block) % 8 == i, start:start + size] = pattern
    return RawTensor(np.ascontiguousarray(blocks.reshape(rows, -1)), int(qtype), (rows, k))


def shape_of(qtype: Q) -> tuple[int, int]:
    """101 outputs: every pair of edge scales (d, min), and a ragged last tile at every width;
    K: two super-blocks, or 5 blocks of 32."""
    return 101, 512 if qtype in K_SCALES else 160


@pytest.mark.parametrize("qtype", REGISTER_TYPES, ids=lambda t: t.name)
def test_every_weight_is_gguf_s_float(isa, qtype):
    """Row i of x is one-hot at k_i, so y[i, n] is weight (n, k_i) itself, exactly (a zero's
    sign aside: +0 + -0 is +0): every weight, through 1, 2, 3 and 4 rows at a time."""
    raw = edge_blocks(qtype, *shape_of(qtype), seed=int(qtype))
    weight, dense = quant_weight(raw), dequantized(raw)
    n, k = raw.shape
    for rows in (1, 2, 3, 4):
        ks = torch.arange(k).roll(rows)  # each k once, in other company at each row count
        for first in range(0, k, rows):
            picked = ks[first:first + rows]
            x = torch.zeros(len(picked), k)
            x[torch.arange(len(picked)), picked] = 1.0
            got, expected = kernels.linear_q(x, weight, None, 1), dense[:, picked].T
            wrong = torch.nonzero(got != expected)
            if len(wrong):
                i, out = wrong[0].tolist()
                pytest.fail(f"{rows} rows: weight (row {out}, k {int(picked[i])}) is {got[i, out].item()!r}, "
                            f"gguf.quants' {expected[i, out].item()!r} ({len(wrong)} of {got.numel()} differ)")


@pytest.mark.parametrize("qtype", REGISTER_TYPES, ids=lambda t: t.name)
def test_one_to_four_rows_are_bitwise_the_float32_matmul(isa, qtype):
    raw = edge_blocks(qtype, *shape_of(qtype), seed=int(qtype) + 1)
    weight, dense = quant_weight(raw), dequantized(raw)
    d = dense.view(-1)
    assert bool(((d == 0) & torch.signbit(d)).any()) and float(d.abs().max()) >= 65504
    assert bool(((d != 0) & (d.abs() < 2 ** -14)).any())  # from a subnormal scale
    x = torch.randn(9, raw.shape[1], generator=torch.Generator().manual_seed(int(qtype)))
    bias = torch.randn(raw.shape[0], generator=torch.Generator().manual_seed(2))
    for start, rows in ((0, 1), (3, 1), (0, 2), (5, 2), (0, 3), (2, 3), (0, 4), (5, 4), (0, 9)):
        xs = x[start:start + rows]
        for threads in (1, 2):
            got, expected = kernels.linear_q(xs, weight, bias, threads), kernels.linear(xs, dense, bias, 2)
            differ = int((bits(got) != bits(expected)).sum())
            assert differ == 0, f"rows {start}..{start + rows - 1}, {threads} threads: {differ} outputs differ"

