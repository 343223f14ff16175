"""Random GGUF blocks of any type, with scales that are ordinary float16 values, for the
types gguf.quants cannot quantize (the K-quants) and for kernel tests of every type."""

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from batchproof.engine.model.weights import RawTensor

Q = GGMLQuantizationType
# Byte offsets of each block's float16 scales (d, and the min where there is one).
SCALE_OFFSETS = {Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0], Q.Q4_K: [0, 2],
                 Q.Q5_K: [0, 2], Q.Q6_K: [208]}


def random_blocks(qtype: GGMLQuantizationType, rows: int, k: int, seed: int) -> np.ndarray:
    """[rows, row_bytes] uint8: random quants, sane scales."""
    rng = np.random.default_rng(seed)
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    if qtype == Q.F32:
        return rng.standard_normal((rows, k), dtype=np.float32).view(np.uint8)
    if qtype == Q.F16:
        return (rng.standard_normal((rows, k)) * 0.5).astype(np.float16).view(np.uint8)
    if qtype == Q.BF16:
        return (rng.standard_normal((rows, k), dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    blocks = rng.integers(0, 256, (rows, k // block_elems, block_bytes), dtype=np.uint8)
    for offset in SCALE_OFFSETS[qtype]:
        scales = rng.uniform(-0.05, 0.05, (rows, k // block_elems)).astype(np.float16)
        blocks[:, :, offset:offset + 2] = scales.view(np.uint8).reshape(rows, -1, 2)
    return np.ascontiguousarray(blocks.reshape(rows, -1))


def dequantized(raw: RawTensor) -> torch.Tensor:
    """gguf.quants' float32 weight for a tensor of blocks: the reference every quantized path must equal."""
    values = quants.dequantize(raw.data, Q(raw.qtype)).reshape(raw.shape)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))


def bits(t: torch.Tensor) -> torch.Tensor:
    """A float32 tensor's bit patterns, for equality that tells -0.0 from 0.0 and NaNs apart."""
    return t.contiguous().view(torch.int32)
