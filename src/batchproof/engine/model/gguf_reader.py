"""A GGUF header reader: metadata as Python values, tensors as views of the mapped file.

Why not gguf-py's GGUFReader: it builds a numpy view for every element of every array,
so a 49,152-token vocabulary (its strings, scores and types, and 48,900 merges) takes
~5 s to parse on a small CPU, and Gemma's 262,144 tokens far longer; the values are the
same. Here each array of numbers is one `np.frombuffer`, and each string one slice of
the header read into memory. The tensor data is never read: it stays in the memory map.
Metadata values take the shapes `GGUFReader`'s `field.contents()` gives (str, int,
float, bool, lists of them), which tests/engine/test_model_file.py checks against it.
"""

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# GGUF value types: numpy dtype of each fixed-size one (7 is bool, 8 string, 9 array).
NUMBER_TYPES = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
                7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
STRING, ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32


class GGUFFormatError(ValueError):
    """The bytes are not a GGUF file we can read; the message says where and why."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_id: int  # a ggml type number (gguf.GGMLQuantizationType)
    dims: tuple[int, ...]  # as GGUF lists them, fastest first
    data: np.ndarray  # the tensor's bytes: a read-only uint8 view of the mapped file

    @property
    def shape(self) -> tuple[int, ...]:
        """As PyTorch wants it: [out, in]."""
        return tuple(reversed(self.dims))


class _Cursor:
    def __init__(self, buffer: memoryview) -> None:
        self.buffer = buffer
        self.at = 0

    def take(self, n: int) -> memoryview:
        if self.at + n > len(self.buffer):
            raise GGUFFormatError(f"the header ends early (wanted {n} bytes at offset {self.at}, "
                                  f"the file has {len(self.buffer)})")
        piece = self.buffer[self.at:self.at + n]
        self.at += n
        return piece

    def unpack(self, fmt: str) -> Any:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))[0]

    def string(self) -> str:
        raw = self.take(self.unpack("Q"))
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            raise GGUFFormatError(f"a string at offset {self.at - len(raw)} is not UTF-8") from None

    def strings(self, count: int) -> list[str]:
        """count strings in a row: the vocabulary's hot loop, kept to one unpack and one decode each."""
        buffer, at, end, out = self.buffer, self.at, len(self.buffer), []
        length = struct.Struct("<Q").unpack_from
        try:
            for _ in range(count):
                (n,) = length(buffer, at)
                if at + 8 + n > end:
                    raise struct.error
                out.append(str(buffer[at + 8:at + 8 + n], "utf-8"))
                at += 8 + n
        except struct.error:
            raise GGUFFormatError(f"the header ends early (in a string array at offset {at})") from None
        except UnicodeDecodeError:
            raise GGUFFormatError(f"a string at offset {at} is not UTF-8") from None
        self.at = at
        return out

    def value(self, type_id: int) -> Any:
        if type_id == STRING:
            return self.string()
        if type_id == ARRAY:
            item_type, count = self.unpack("I"), self.unpack("Q")
            if item_type == STRING:
                return self.strings(count)
            if item_type in NUMBER_TYPES:
                dtype = np.dtype(NUMBER_TYPES[item_type]).newbyteorder("<")
                return np.frombuffer(self.take(count * dtype.itemsize), dtype=dtype).tolist()
            return [self.value(item_type) for _ in range(count)]
        if type_id not in NUMBER_TYPES:
            raise GGUFFormatError(f"unknown value type {type_id} at offset {self.at}")
        dtype = np.dtype(NUMBER_TYPES[type_id]).newbyteorder("<")
        return np.frombuffer(self.take(dtype.itemsize), dtype=dtype).tolist()[0]


def read_gguf(path: Path, tensor_bytes) -> tuple[dict[str, Any], list[TensorInfo]]:
    """Metadata and tensors of a GGUF file (version 2 or 3, little-endian).

    tensor_bytes(type_id, dims) -> the byte size of a tensor (None for a type unknown to us).
    """
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    cursor = _Cursor(memoryview(mapped))
    if bytes(cursor.take(4)) != b"GGUF":
        raise GGUFFormatError("not a GGUF file")
    version = cursor.unpack("I")
    if version not in (2, 3):
        raise GGUFFormatError(f"GGUF version {version} (we read 2 and 3)")
    num_tensors, num_keys = cursor.unpack("Q"), cursor.unpack("Q")
    metadata: dict[str, Any] = {}
    for _ in range(num_keys):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.unpack("I"))
    headers = []
    for _ in range(num_tensors):
        name = cursor.string()
        dims = tuple(cursor.unpack("Q") for _ in range(cursor.unpack("I")))
        headers.append((name, cursor.unpack("I"), dims, cursor.unpack("Q")))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-cursor.at // alignment) * alignment
    whole = np.frombuffer(mapped, dtype=np.uint8)
    tensors = []
    for name, type_id, dims, offset in headers:
        size = tensor_bytes(type_id, dims)
        if size is None:
            raise GGUFFormatError(f"tensor {name!r} has ggml type {type_id}, which this gguf package does not know")
        start = data_start + offset
        if start + size > len(whole):
            raise GGUFFormatError(f"tensor {name!r} ends at byte {start + size}, past the end of the file "
                                  f"({len(whole)} bytes)")
        tensors.append(TensorInfo(name, type_id, dims, whole[start:start + size]))
    return metadata, tensors
