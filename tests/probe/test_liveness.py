"""Live or buffered, from arrival times alone; and what a declaration is worth against them."""

import pytest

from batchproof.probe.records.liveness import bursts, observe, stream_mode


def test_arrivals_closer_than_a_millisecond_are_one_burst() -> None:
    assert bursts([]) == 0
    assert bursts([1.0, 1.0004, 1.0008, 1.5, 1.5001, 2.0]) == 3


@pytest.mark.parametrize(
    ("arrivals", "total", "seen"),
    [
        ([0.1 + 0.01 * i for i in range(20)], 0.35, "live"),  # token by token over most of the request
        ([1.0 + 0.00001 * i for i in range(128)], 1.0002, "buffered"),  # one flush at the end
        ([0.95, 0.96, 0.97, 0.98, 0.99], 1.0, "buffered"),  # five bursts, but in the last 5% only
        ([0.1, 0.5, 0.9], 1.0, "unknown"),  # too few chunks to tell
        ([0.1, 0.2, 0.3, 0.4], None, "unknown"),  # the stream never ended
    ],
)
def test_observe(arrivals: list[float], total: float | None, seen: str) -> None:
    assert observe(arrivals, total) == seen


def test_a_declaration_counts_unless_the_arrivals_show_a_buffered_reply() -> None:
    assert stream_mode("live", "live") == ("declared", None)
    assert stream_mode("live", "unknown") == ("declared", None)
    mode, conflict = stream_mode("live", "buffered")
    assert mode == "buffered" and "declared stream_mode live" in conflict
    assert stream_mode(None, "live") == ("observed", None)
    mode, conflict = stream_mode("replay", "live")
    assert mode == "observed" and "'replay'" in conflict
    assert stream_mode(None, "buffered") == ("buffered", None)
    assert stream_mode(None, "unknown") == ("buffered", None)
