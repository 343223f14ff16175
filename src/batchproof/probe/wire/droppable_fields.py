"""Any server: fields the probe can do without, dropped (and recorded) when a server refuses them."""

import dataclasses
import re
from collections.abc import Awaitable, Callable, Sequence

from batchproof.probe.records.reply import StreamResult
from batchproof.probe.wire.stream import StreamRequest

# In the order they are given up when a refusal names none of them: `ignore_eos` changes the
# most (a reply may then end early and is compared over its length), `stream_options` the least
# (without it a stream may carry no usage, which is then reported as such).
DROPPABLE = ("ignore_eos", "seed", "stream_options")
# 400 for most servers, 422 for pydantic's (FastAPI's `extra_forbidden`: Hugging Face's `transformers serve`).
REFUSED_STATUSES = (400, 422)


def named_fields(body_text: str, present: Sequence[str]) -> list[str]:
    """The droppable fields a refusal's body names, among those the request carried."""
    return [name for name in DROPPABLE if name in present and re.search(rf"\b{name}\b", body_text)]


def next_drop(result: StreamResult, present: Sequence[str]) -> tuple[list[str], bool]:
    """What to drop after `result`, and whether the refusal named it: [] when it was not a refusal
    (any other error is the request's own); the fields it names; else the first droppable field
    still sent, as a guess."""
    if result.status not in REFUSED_STATUSES:
        return [], False
    named = named_fields(result.refusal_body, present)
    if named:
        return named, True
    return [name for name in DROPPABLE if name in present][:1], False


def without(request: StreamRequest, names: Sequence[str]) -> StreamRequest:
    return dataclasses.replace(request, body={k: v for k, v in request.body.items() if k not in names})


async def negotiate(
    request: StreamRequest, fire: Callable[[StreamRequest], Awaitable[StreamResult]]
) -> tuple[StreamRequest, list[str], StreamResult]:
    """Fire `request`; while the server refuses a field the probe can do without, fire it again
    without that field. (the request that was answered, the fields dropped in order, its reply).
    Fields dropped on a guess (the refusal named none) are kept out only if that got an answer:
    a request refused for something else goes on without only the named ones (its reply: the last refusal)."""
    original = request
    dropped: list[str] = []
    named: list[str] = []
    while True:
        result = await fire(request)
        names, is_named = next_drop(result, list(request.body))
        if not names:
            if result.status in REFUSED_STATUSES:
                # Still refused: the guessed fields were not the cause; only the named stay out.
                return without(original, named), named, result
            return request, dropped, result
        dropped += names
        named += names if is_named else []
        request = without(request, names)
