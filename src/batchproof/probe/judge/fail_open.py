"""Fail-open: a 200 without the logprobs asked for, named by its route and whether it streamed.
Never a pass and never "unmeasurable": a client that asked for logprobs was answered without them."""

from collections.abc import Iterable
from typing import Any

from batchproof.probe.records.reply import StreamResult


def fail_open_record(results: Iterable[StreamResult], route_path: str) -> list[dict[str, Any]]:
    """One entry per way of asking (streamed, whole) that was answered fail-open, in that order."""
    counts = {True: 0, False: 0}
    for result in results:
        if result.is_fail_open:
            counts[result.is_streamed] += 1
    return [
        {"route": route_path, "streamed": streamed, "requests": n,
         "what": "HTTP 200 with content but no logprobs, though the request asked for them"}
        for streamed, n in counts.items() if n
    ]


def fail_open_line(entry: dict[str, Any]) -> str:
    how = "streamed" if entry["streamed"] else "not streamed"
    return f"fail-open: {entry['route']} ({how}) answered {entry['requests']} request(s) with {entry['what']}"
