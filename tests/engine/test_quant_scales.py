"""Block scales at the edges of float16: subnormals, +0, -0 and +-65504 (the largest finite
half). The kernels convert a block's scale bit by bit (or by a table built that way, or by
F16C), and a conversion that flushed subnormals, lost a zero's sign or misread the top
exponent would change weights that gguf.quants reads exactly. Each is held to the float32
matmul over gguf.quants' dequantized weight, bit for bit, at 1 to 4 rows of x (blocks unpacked
in registers on AVX2 and AVX-512) and at 9 (through a buffer), on every instruction set here."""

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from batchproof.engine.model.ops import kernels
from batchproof.engine.model.weights import RawTensor, quant_weight
from tests.helpers.quant_blocks import SCALE_OFFSETS, bits, dequantized, random_blocks

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the kernels are not built here")

Q = GGMLQuantizationType
# float16 bit patterns: the smallest, a middling and the largest subnormal (and the smallest
# negated), +0, -0, the largest finite value and its negation.
EDGE_SCALES = np.array([0x0001, 0x0155, 0x03FF, 0x8001, 0x0000, 0x8000, 0x7BFF, 0xFBFF], dtype=np.uint16)



def edge_blocks(qtype: Q, rows: int, k: int) -> RawTensor:
    """Random quants whose every scale is one of EDGE_SCALES, each row's scales of one
    magnitude so that no larger one swamps them in the row's sums: row r takes d =
    EDGE_SCALES[r % 8] and (Q4_1) m = EDGE_SCALES[r // 8 % 8], so 64 rows meet every pair;
    the sign flips from block to block (d every other block, m every other two)."""
    blocks = random_blocks(qtype, rows, k, seed=int(qtype)).reshape(rows, k // 32, GGML_QUANT_SIZES[qtype][1])
    row, block = np.arange(rows)[:, None], np.arange(k // 32)[None, :]
    for scale, offset in enumerate(SCALE_OFFSETS[qtype]):
        sign = np.where((block >> scale) & 1, 0x8000, 0).astype(np.uint16)
        patterns = EDGE_SCALES[row // 8 ** scale % len(EDGE_SCALES)] ^ sign
        blocks[:, :, offset:offset + 2] = patterns.view(np.uint8).reshape(rows, -1, 2)
    return RawTensor(np.ascontiguousarray(blocks.reshape(rows, -1)), int(qtype), (rows, k))


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0], ids=lambda t: t.name)
def test_edge_scales_give_the_float32_matmul_on_gguf_s_weights(isa, qtype):
    raw = edge_blocks(qtype, 65, 256)  # 65 outputs: every (d, m) pair, and a ragged last tile
    weight, dense = quant_weight(raw), dequantized(raw)
    d = dense.view(-1)
    assert bool(((d == 0) & torch.signbit(d)).any()) and bool(((d == 0) & ~torch.signbit(d)).any())
    assert float(d.abs().max()) >= 65504 and bool(((d != 0) & (d.abs() < 2 ** -14)).any())  # from a subnormal d
    ids = torch.tensor([0, 64, 5, 5, 11])
    rows_out, rows_expected = bits(kernels.dequant_rows(weight, ids)), bits(dense[ids])
    assert torch.equal(rows_out, rows_expected), f"dequant_rows: {int((rows_out != rows_expected).sum())} differ"
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(int(qtype)))
    for rows in (1, 2, 3, 4, 9):
        got, expected = kernels.linear_q(x[:rows], weight, None, 2), kernels.linear(x[:rows], dense, None, 2)
        assert torch.equal(bits(got), bits(expected)), f"{rows} rows: {int((bits(got) != bits(expected)).sum())} differ"
