"""Weights kept in their GGUF block formats: the file's bytes, never expanded to float32.

A matmul weight may be several tensors side by side (Q, K and V fused into one output),
each in its own type; adjacent parts of one type are merged into one block array.
"""

from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class QuantPart:
    data: np.ndarray  # [rows, row_bytes] uint8: rows of GGUF blocks, C-contiguous, owned
    qtype: int  # GGML type id
    rows: int


@dataclass(frozen=True)
class QuantWeight:
    """A [N, K] weight as block rows; the kernels dequantize it as they multiply."""

    parts: tuple[QuantPart, ...]
    shape: tuple[int, int]

    @cached_property
    def offsets(self) -> list[int]:
        """The first output column of each part (read by every matmul: computed once)."""
        return np.cumsum([0] + [p.rows for p in self.parts])[:-1].tolist()

    @property
    def nbytes(self) -> int:
        return sum(p.data.nbytes for p in self.parts)


@dataclass(frozen=True)
class RawTensor:
    """A tensor as read from the file: its blocks and its GGML type, not dequantized."""

    data: np.ndarray  # [rows, row_bytes] uint8
    qtype: int
    shape: tuple[int, int]  # [rows, K], as torch orders a weight


def as_raw(tensor: "np.ndarray | RawTensor") -> RawTensor:
    """A float32 array as F32 blocks (to sit beside quantized parts in one fused weight)."""
    if isinstance(tensor, RawTensor):
        return tensor
    return RawTensor(np.ascontiguousarray(tensor, dtype=np.float32).view(np.uint8), 0, tensor.shape)


def quant_weight(*tensors: RawTensor) -> QuantWeight:
    """Stack tensors of equal K along the output dimension, merging same-type neighbours."""
    k = tensors[0].shape[1]
    assert all(t.shape[1] == k for t in tensors)
    groups: list[list[RawTensor]] = []
    for t in tensors:
        if groups and groups[-1][0].qtype == t.qtype:
            groups[-1].append(t)
        else:
            groups.append([t])
    parts = tuple(
        QuantPart(np.ascontiguousarray(np.concatenate([t.data for t in g])), g[0].qtype, sum(t.shape[0] for t in g))
        for g in groups
    )
    return QuantWeight(parts, (sum(t.shape[0] for t in tensors), k))
