"""Weights kept in their GGUF block formats: the file's bytes, never expanded to float32.

A matmul weight may be several tensors side by side (Q, K and V fused into one output),
each in its own type; adjacent parts of one type are merged into one block array.
"""

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from batchproof.engine.memory import drop_mapped_range

COPY_CHUNK_BYTES = 8 << 20


@dataclass(frozen=True)
class QuantPart:
    data: np.ndarray  # [rows, row_bytes] uint8: rows of GGUF blocks, C-contiguous, owned
    qtype: int  # GGML type id
    rows: int
    # "blocks": the file's GGUF blocks; "int8x8": the int8 numerics' layout (8 rows interleaved,
    # scales formed once: quant_int8.h), data then [tiles of 8 rows, bytes a tile].
    layout: str = "blocks"

    @cached_property
    def address(self) -> int:
        """data's address for the kernels, read once: numpy's .ctypes builds an object at every
        read (a few microseconds a matmul; an OLMoE token runs ~300 matmuls at one stream)."""
        return self.data.ctypes.data


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


def same_type_runs(tensors: tuple[RawTensor, ...]) -> list[list[RawTensor]]:
    """Tensors of equal K, side by side, grouped into runs of neighbours of one type (each run
    one part of a QuantWeight)."""
    k = tensors[0].shape[1]
    assert all(t.shape[1] == k for t in tensors)
    groups: list[list[RawTensor]] = []
    for t in tensors:
        if groups and groups[-1][0].qtype == t.qtype:
            groups[-1].append(t)
        else:
            groups.append([t])
    return groups


def quant_weight(*tensors: RawTensor) -> QuantWeight:
    """Stack tensors of equal K along the output dimension, merging same-type neighbours."""
    k = tensors[0].shape[1]
    groups = same_type_runs(tensors)
    parts = tuple(QuantPart(owned_rows([t.data for t in g]), g[0].qtype, sum(t.shape[0] for t in g)) for g in groups)
    return QuantWeight(parts, (sum(t.shape[0] for t in tensors), k))


def owned_rows(sources: list[np.ndarray]) -> np.ndarray:
    """The block rows of `sources` stacked into one array of our own, copied a few MB at a time,
    each piece's file pages dropped once copied: a file's tensor and its copy are never both
    resident (Gemma 3's embedding, 262,144 rows, is ~170 MB: the load's peak was both)."""
    out = np.empty((sum(s.shape[0] for s in sources), sources[0].shape[1]), dtype=np.uint8)
    row = 0
    for source in sources:
        step = max(1, COPY_CHUNK_BYTES // max(1, source.shape[1]))
        for start in range(0, source.shape[0], step):
            piece = source[start:start + step]
            out[row + start:row + start + piece.shape[0]] = piece
            drop_mapped_range(piece)
        row += source.shape[0]
    return out
