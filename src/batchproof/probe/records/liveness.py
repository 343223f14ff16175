"""Live or buffered: what a stream's arrival times show, what its declaration is worth, and the
decode rate they give when live."""

from collections.abc import Sequence
from typing import Literal

Observed = Literal["live", "buffered", "unknown"]
StreamMode = Literal["declared", "observed", "buffered"]

# Content chunks closer together than this arrived in one burst (one network read, one flush).
BURST_GAP_S = 0.001
# A live stream shows at least this many bursts ...
MIN_BURSTS = 4
# ... spread over at least this share of the request's time (POST to the stream's end). A
# reply generated in full and flushed at the end arrives in a sliver at the very end, however
# many chunks it is cut into; a live one spreads over the decode, which is most of a request.
MIN_SPAN_SHARE = 0.1


def bursts(arrivals: Sequence[float]) -> int:
    """How many groups the arrival times fall into, a new group after each gap > BURST_GAP_S."""
    return sum(1 for i, t in enumerate(arrivals) if i == 0 or t - arrivals[i - 1] > BURST_GAP_S)


def observe(arrivals: Sequence[float], total_s: float | None) -> Observed:
    """`live` when content came in >= MIN_BURSTS bursts over >= MIN_SPAN_SHARE of the request;
    `unknown` when the stream had too few content chunks to tell; else `buffered`."""
    if len(arrivals) < MIN_BURSTS or total_s is None or total_s <= 0:
        return "unknown"
    span = arrivals[-1] - arrivals[0]
    if bursts(arrivals) >= MIN_BURSTS and span >= MIN_SPAN_SHARE * total_s:
        return "live"
    return "buffered"


def stream_mode(declared: str | None, observed: Observed) -> tuple[StreamMode, str | None]:
    """The slot's mode and, when the declaration and the observation disagree, why.

    A declared live stream counts unless its arrivals show a buffered reply: a buffered reply
    never counts as live. An undeclared stream counts when it is observed live.
    """
    if declared == "live":
        if observed == "buffered":
            return "buffered", "declared stream_mode live, but its content arrived buffered"
        return "declared", None
    if observed == "live":
        conflict = None if declared is None else f"declared stream_mode {declared!r}, but observed live"
        return "observed", conflict
    return "buffered", None


def is_timed(mode: StreamMode) -> bool:
    """Decode rates are read only off live streams, declared or observed."""
    return mode != "buffered"


def decode_rate(is_live: bool, arrivals: Sequence[float], completion_tokens: int | None) -> float | None:
    """(completion_tokens - 1) / (last arrival - first), only on a live stream."""
    if not is_live or len(arrivals) < 2 or completion_tokens is None or completion_tokens < 2:
        return None
    span = arrivals[-1] - arrivals[0]
    return (completion_tokens - 1) / span if span > 0 else None
