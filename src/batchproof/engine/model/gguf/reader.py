"""The GGUF container: header, metadata and tensor directory, read straight from a memory map.

gguf's own GGUFReader builds a numpy view per metadata item, which takes 20 s on a
262,144-entry vocabulary (Gemma 3); this reads the same layout with `struct` in well
under a second. Tensor data stay in the map: a tensor is a view, copied only when used.
"""

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
# GGUF metadata value types -> struct format (8: string, 9: array are read apart)
SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
# tensor types gguf reads as plain numbers rather than blocks
PLAIN_DTYPES = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64, 28: np.float64}


class GGUFFormatError(ValueError):
    """The bytes do not hold a GGUF file we can read (the message says what is wrong)."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    qtype: int  # GGML type
    shape: tuple[int, ...]  # [out, in], slowest dimension first (as PyTorch has it)
    data: np.ndarray  # float array for F32/F16 and the integer types, else uint8 [rows, row bytes]

    @property
    def type_name(self) -> str:
        return GGMLQuantizationType(self.qtype).name


class _Cursor:
    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer, self.at = buffer, 0

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.buffer, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.take("Q")
        if self.at + n > len(self.buffer):
            raise GGUFFormatError(f"a string of {n} bytes runs past the end of the file")
        text = self.buffer[self.at:self.at + n].decode("utf-8", errors="replace")
        self.at += n
        return text

    def strings(self, count: int) -> list[str]:
        """count strings in a row (a vocabulary): the hot loop, one unpack and one decode each."""
        buffer, at, end, out = self.buffer, self.at, len(self.buffer), []
        length = struct.Struct("<Q").unpack_from
        for _ in range(count):
            (n,) = length(buffer, at)
            if at + 8 + n > end:
                raise GGUFFormatError(f"a string of {n} bytes runs past the end of the file")
            out.append(buffer[at + 8:at + 8 + n].decode("utf-8", errors="replace"))
            at += 8 + n
        self.at = at
        return out

    def value(self, kind: int) -> Any:
        if kind == 8:
            return self.string()
        if kind == 9:
            item_kind, count = self.take("I"), self.take("Q")
            if item_kind in SCALAR_FORMATS:  # numbers: one numpy read
                fmt = SCALAR_FORMATS[item_kind]
                size = struct.calcsize(fmt) * count
                if self.at + size > len(self.buffer):
                    raise GGUFFormatError(f"an array of {count} items runs past the end of the file")
                values = np.frombuffer(self.buffer, dtype=np.dtype("<" + fmt), count=count, offset=self.at)
                self.at += size
                return values.tolist()
            if item_kind == 8:
                return self.strings(count)
            return [self.value(item_kind) for _ in range(count)]
        if kind not in SCALAR_FORMATS:
            raise GGUFFormatError(f"unknown metadata value type {kind}")
        return self.take(SCALAR_FORMATS[kind])


def read_gguf(path: Path) -> tuple[dict[str, Any], list[TensorEntry]]:
    """(metadata, tensors) of a GGUF file; GGUFFormatError when the bytes are not one."""
    with path.open("rb") as f:
        buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _parse(buffer)
    except (struct.error, IndexError, OverflowError, MemoryError) as e:
        raise GGUFFormatError(f"the file ends inside its header ({type(e).__name__}: {e})") from None
    except RecursionError:  # arrays of arrays, nested deeper than Python's stack
        raise GGUFFormatError("its metadata nests arrays too deeply") from None


def _parse(buffer: mmap.mmap) -> tuple[dict[str, Any], list[TensorEntry]]:
    cursor = _Cursor(buffer)
    if cursor.take("4s") != b"GGUF":
        raise GGUFFormatError("not a GGUF file")
    version = cursor.take("I")
    if version not in SUPPORTED_VERSIONS:
        raise GGUFFormatError(f"GGUF version {version} is not supported (supported: 2, 3)")
    num_tensors, num_keys = cursor.take("Q"), cursor.take("Q")
    metadata: dict[str, Any] = {}
    for _ in range(num_keys):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.take("I"))
    directory = [_tensor_header(cursor) for _ in range(num_tensors)]
    alignment = _alignment(metadata)
    start = (cursor.at + alignment - 1) // alignment * alignment
    data = np.frombuffer(buffer, dtype=np.uint8)
    tensors = [_tensor(data, start, alignment, *entry) for entry in directory]
    _check_disjoint([(name, offset, t.data.nbytes) for (name, _, _, offset), t in zip(directory, tensors)])
    return metadata, tensors


def _tensor_header(cursor: _Cursor) -> tuple[str, list[int], int, int]:
    """(name, dims fastest first, type, offset), the dimensions as GGML bounds them."""
    name = cursor.string()
    num_dims = cursor.take("I")
    if not 1 <= num_dims <= MAX_DIMS:
        raise GGUFFormatError(f"tensor {name!r} has {num_dims} dimensions (GGUF allows 1 to {MAX_DIMS})")
    dims = [cursor.take("Q") for _ in range(num_dims)]
    if 0 in dims:
        raise GGUFFormatError(f"tensor {name!r} has a dimension of 0 ({dims})")
    return name, dims, cursor.take("I"), cursor.take("Q")


def _check_disjoint(spans: list[tuple[str, int, int]]) -> None:
    """No two tensors share bytes (llama.cpp requires them packed in order; shared bytes mean a crafted file)."""
    spans = sorted(spans, key=lambda span: span[1])
    for (name, at, size), (next_name, next_at, _) in zip(spans, spans[1:]):
        if at + size > next_at:
            raise GGUFFormatError(f"tensors {name!r} and {next_name!r} overlap in the file")


def _alignment(metadata: dict[str, Any]) -> int:
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    # A power of two, as llama.cpp requires: 0 would divide by zero, and data offsets are checked against it.
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment < 1 or alignment & (alignment - 1):
        raise GGUFFormatError(f"general.alignment {alignment!r} is not a power of two")
    return alignment


def _tensor(data: np.ndarray, start: int, alignment: int, name: str, dims: list[int], qtype: int,
            offset: int) -> TensorEntry:
    """The tensor's bytes, once its type, block layout, offset and size are known to fit the file."""
    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    except (ValueError, KeyError):
        raise GGUFFormatError(f"tensor {name!r} has unknown type {qtype}") from None
    if dims[0] % block:  # rows are whole blocks: a partial one would be read past its row
        raise GGUFFormatError(f"tensor {name!r} has rows of {dims[0]} values, not a multiple of "
                              f"{GGMLQuantizationType(qtype).name}'s block of {block}")
    if offset % alignment:
        raise GGUFFormatError(f"tensor {name!r} starts at offset {offset}, not a multiple of the alignment "
                              f"{alignment}")
    shape = tuple(int(d) for d in reversed(dims))
    num_bytes = math.prod(shape) // block * type_size  # Python integers: a crafted shape cannot overflow
    begin = start + offset
    if begin + num_bytes > len(data):
        raise GGUFFormatError(f"tensor {name!r} runs past the end of the file (truncated)")
    raw = data[begin:begin + num_bytes]
    if qtype in PLAIN_DTYPES:
        return TensorEntry(name, qtype, shape, raw.view(PLAIN_DTYPES[qtype]).reshape(shape))
    return TensorEntry(name, qtype, shape, raw.reshape(shape[0] if len(shape) > 1 else 1, -1))
