"""A body's size in JSON values, counted before it is parsed, and its lists counted on the parsed
JSON before pydantic validates it. Parsing and validation each run in one Rust call with the
GIL held, so while they work every stream and /health wait. Measured on 2 cores (Zen 3):
validation costs ~2.7 us an object (65,536 chat messages: 179 ms; 288,938 content parts in one
message: ~0.8 s, refused only after it) and 60-250 ns a value otherwise; parsing 30-130 ns a
value (3,000,000 numbers: 209 ms). So the raw bytes are counted first, with C-speed byte counts
(~1 ms a MiB): a body with more objects or values than the budgets below is refused before
either runs, whichever field holds them (content parts, tool arguments, schemas, stop strings,
logit_bias, ids). Within the budgets, parsing and validating a body each hold the GIL under
~60 ms. Then the named lists are counted (`counted_items`) with the message naming the field."""

from typing import Any

import pydantic_core

from batchproof.server.errors import APIError

# The budgets: objects are what validation pays most for (a chat message, a content part, a tool);
# an object's members what parsing pays most for (~350 ns a pair: Responses metadata of 300,000
# keys took 106 ms to parse); values are every item of every list and object. 16,384 objects is
# far more messages or parts than a context holds; a logit_bias over 131,072 tokens fits.
MAX_JSON_OBJECTS = 16_384
MAX_JSON_MEMBERS = 131_072
MAX_JSON_VALUES = 600_000
SCAN_SLICE_BYTES = 256 * 2**10  # the exact count's step: other threads run between slices
# Below this a body is validated straight away: a small body's lists are cheap whatever they hold.
PRECOUNT_FROM_BYTES = 64 * 2**10
# Any one list of messages, prompts or input items: far more turns than a context holds
# (each takes at least a token), far fewer than a body of megabytes can spell.
MAX_LISTED_ITEMS = 65_536
NOUNS = {"prompt": "prompts", "messages": "messages", "tools": "tools", "input": "input items", "metadata": "pairs"}


def _count(field: str, value: Any) -> int | None:
    """How many of what the field lists: prompts for `prompt` (a flat list of token ids is one)."""
    if isinstance(value, dict):
        return len(value)
    if not isinstance(value, list):
        return None
    if field == "prompt" and value and not isinstance(value[0], (str, list)):
        return 1
    return len(value)


def _count_structure(text: bytes) -> tuple[int, int, int]:
    """(objects, members, values) in a JSON text: '{', ':', and ',' '[' '{' + 1, each an upper
    bound (a string may hold them). Bytes.count runs at memory speed."""
    objects = text.count(b"{")
    return objects, text.count(b":"), objects + text.count(b"[") + text.count(b",") + 1


def _count_structure_outside_strings(body: bytes) -> tuple[int, int, int]:
    """The same counts with the strings' contents left out: escaped backslashes and quotes removed,
    the rest split at quotes, a slice at a time (the GIL is free between slices)."""
    text = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    objects = members = values = 0
    is_inside = False
    for start in range(0, len(text), SCAN_SLICE_BYTES):
        parts = text[start:start + SCAN_SLICE_BYTES].split(b'"')
        counted = _count_structure(b"".join(parts[1::2] if is_inside else parts[0::2]))
        objects, members, values = objects + counted[0], members + counted[1], values + counted[2] - 1
        is_inside ^= len(parts) % 2 == 0  # an odd number of quotes in the slice
    return objects, members, values + 1


def check_structure(body: bytes) -> None:
    """400 when the body holds more JSON objects or values than the budgets, before it is parsed.
    The byte counts decide at once for nearly every body; only one whose strings hold many
    brackets or commas (a long document) is counted again without them."""
    objects, members, values = _count_structure(body)
    if objects > MAX_JSON_OBJECTS or members > MAX_JSON_MEMBERS or values > MAX_JSON_VALUES:
        objects, members, values = _count_structure_outside_strings(body)
    if objects > MAX_JSON_OBJECTS:
        raise APIError(400, f"the request body holds {objects} JSON objects; at most {MAX_JSON_OBJECTS} are "
                            "read in one request (messages, content parts, tools, schemas together)")
    if members > MAX_JSON_MEMBERS:
        raise APIError(400, f"the request body holds {members} members of JSON objects; at most {MAX_JSON_MEMBERS} "
                            "are read in one request (logit_bias, metadata and every object's keys together)")
    if values > MAX_JSON_VALUES:
        raise APIError(400, f"the request body holds about {values} JSON values; at most {MAX_JSON_VALUES} are "
                            "read in one request (every item of every list and object)")


def precount(body: bytes, limits: dict[str, int]) -> None:
    """400 when the body is over the JSON budgets, or names the first field of `limits`
    ({field: most items}) that holds more; a body that does not parse is left to validation,
    which names what is wrong with it."""
    check_structure(body)
    if len(body) < PRECOUNT_FROM_BYTES or not limits:
        return
    try:
        parsed = pydantic_core.from_json(body)
    except ValueError:
        return
    if not isinstance(parsed, dict):
        return
    for field, most in limits.items():
        count = _count(field, parsed.get(field))
        if count is not None and count > most:
            noun = NOUNS.get(field, "items")
            raise APIError(400, f"'{field}' holds {count} {noun}; at most {most} {noun} are taken here", param=field)
