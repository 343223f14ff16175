"""Large replies encoded off the event loop, and in pieces. `json.dumps` encodes a whole reply in
one C call with the GIL held: a reply at --max-logprob-entries (100,000 entries, ~5 MB) or a
tokenized megabyte with its token strings held every stream and /health for that long, on the
event loop besides. Here the reply is built and encoded on a worker thread, a long list a
slice of items at a time, so that other threads (the event loop among them) run between
slices. The bytes are exactly Starlette's JSONResponse's."""

import json
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

# A list longer than this is encoded this many items a call (a logprob entry with 20
# alternatives is ~1 KB: ~1 MB, a few ms, a call); a shorter one is walked item by item.
SLICE_ITEMS = 1024
WALKED_ITEMS = 8


def _dumps(value: Any) -> str:
    # JSONResponse.render's settings
    return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))


def _pieces(value: Any, out: list[str]) -> None:
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        out.append("{")
        for i, (key, item) in enumerate(value.items()):
            out.append(("," if i else "") + _dumps(key) + ":")
            _pieces(item, out)
        out.append("}")
    elif isinstance(value, list | tuple) and len(value) <= WALKED_ITEMS:
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _pieces(item, out)
        out.append("]")
    elif isinstance(value, list | tuple):
        out.append("[")
        for start in range(0, len(value), SLICE_ITEMS):
            # "[a,b]" -> "a,b": one call for the slice
            out.append(("," if start else "") + _dumps(list(value[start:start + SLICE_ITEMS]))[1:-1])
        out.append("]")
    else:
        out.append(_dumps(value))


def encode_json(value: Any) -> bytes:
    out: list[str] = []
    _pieces(value, out)
    return "".join(out).encode("utf-8")


async def json_reply(build: Callable[[], Any], status_code: int = 200,
                     headers: dict[str, str] | None = None) -> Response:
    """The reply `build()` makes, built and encoded on a worker thread."""
    body = await run_in_threadpool(lambda: encode_json(build()))
    return Response(body, status_code=status_code, headers=headers, media_type="application/json")
