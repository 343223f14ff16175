"""A rollout's claimed routing (R3, docs/moe.md): the experts each fed position was routed to in
every MoE layer, read from vLLM's `routed_experts` (the base64 of the .npy bytes of an integer
array [positions, MoE layers, k]) or from the same as nested lists, and set against the routing
the notary's own forward pass chose for the same tokens: the first position, MoE layer and
experts where they differ. Standard library only: the notary runs without numpy."""

import ast
import base64
import binascii
import struct

Routes = list[list[list[int]]]  # [positions][MoE layers][k] expert ids
_MAGIC = b"\x93NUMPY"
# The integer types a receipt may use (vLLM: uint8, uint16, int32), little-endian or single-byte.
_CODES = {"u1": "B", "i1": "b", "u2": "H", "i2": "h", "u4": "I", "i4": "i", "u8": "Q", "i8": "q"}


class RoutesError(ValueError):
    """A claimed routing that cannot be read; the message says why (the caller names the field)."""


def _from_npy(data: bytes) -> Routes:
    """The .npy format's version 1 to 3 header, then C-order integers."""
    if not data.startswith(_MAGIC) or len(data) < 10:
        raise RoutesError("its bytes are not a .npy array (no \\x93NUMPY magic)")
    size_format = "<H" if data[6] == 1 else "<I"
    begin = 8 + struct.calcsize(size_format)
    start = begin + struct.unpack_from(size_format, data, 8)[0]
    try:
        header = ast.literal_eval(data[begin:start].decode("latin-1"))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise RoutesError("its .npy header is not a Python dict literal") from None
    descr, shape = (header.get("descr"), header.get("shape")) if isinstance(header, dict) else (None, None)
    if not (isinstance(descr, str) and descr[:1] in "<|" and descr[1:] in _CODES):
        raise RoutesError(f"its .npy type {descr!r} is not a little-endian integer type")
    if header.get("fortran_order") or not (isinstance(shape, tuple) and len(shape) == 3
                                           and all(isinstance(n, int) and n >= 0 for n in shape)):
        raise RoutesError(f"its .npy array is not a C-order [positions, layers, k] array (shape {shape!r})")
    positions, layers, k = shape
    count, code = positions * layers * k, _CODES[descr[1:]]
    if len(data) - start != count * struct.calcsize(code):
        raise RoutesError(f"it holds {len(data) - start} data bytes, not the {count * struct.calcsize(code)} "
                          f"of shape {list(shape)}")
    flat = struct.unpack_from(f"<{count}{code}", data, start)
    return [[list(flat[(p * layers + i) * k:(p * layers + i + 1) * k]) for i in range(layers)]
            for p in range(positions)]


def _from_lists(value: list) -> Routes:
    rows = value
    if not all(isinstance(row, list) and all(isinstance(ids, list) for ids in row) for row in rows):
        raise RoutesError("as a list it is [positions][layers][k] expert ids, lists all the way down")
    if len({len(row) for row in rows}) > 1 or len({len(ids) for row in rows for ids in row}) > 1:
        raise RoutesError("every position needs the same number of layers, every layer the same k")
    if not all(type(e) is int for row in rows for ids in row for e in ids):
        raise RoutesError("expert ids are integers")
    return rows


def parse_routes(value: object, num_positions: int) -> Routes:
    """A claimed routing -> [positions][layers][k], one row per fed position (the prompt's, then
    the completion's but its last: the last token was never fed, as vLLM counts them)."""
    if isinstance(value, str):
        try:
            routes = _from_npy(base64.b64decode(value, validate=True))
        except binascii.Error:
            raise RoutesError("a string is the base64 of .npy bytes, as vLLM returns it; this is not base64") from None
    elif isinstance(value, list):
        routes = _from_lists(value)
    else:
        raise RoutesError(f"it is a base64 .npy string (vLLM's) or nested lists, not {type(value).__name__}")
    if len(routes) != num_positions:
        raise RoutesError(f"it has {len(routes)} positions; prompt and completion fed {num_positions} "
                          "(all their tokens but the last)")
    if any(e < 0 for row in routes for ids in row for e in ids):
        raise RoutesError("expert ids are >= 0")
    return routes


def _shape(routes: Routes) -> list[int]:
    return [len(routes), len(routes[0]) if routes else 0, len(routes[0][0]) if routes and routes[0] else 0]


def compare_routes(claimed: Routes, ours: Routes, num_prompt: int) -> dict:
    """Where the claimed routing parts from ours: the first position (over prompt + completion;
    `completion_index` too where it lies in the completion), the first MoE layer there (counted
    over the MoE layers only, as the receipt's axis), and both expert lists; and how many
    positions differ at all."""
    if _shape(claimed) != _shape(ours):
        return {"matches": False, "num_positions_differing": len(ours), "first_difference": None,
                "error": f"claimed shape {_shape(claimed)}, ours {_shape(ours)} [positions, MoE layers, k]"}
    differing = [p for p, (theirs, mine) in enumerate(zip(claimed, ours)) if theirs != mine]
    first = None
    if differing:
        p = differing[0]
        layer = next(i for i, (a, b) in enumerate(zip(claimed[p], ours[p])) if a != b)
        first = {"position": p, "completion_index": p - num_prompt if p >= num_prompt else None, "layer": layer,
                 "claimed": claimed[p][layer], "ours": ours[p][layer]}
    return {"matches": not differing, "num_positions_differing": len(differing), "first_difference": first}
