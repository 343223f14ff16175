"""Logprob parity: how far a slot's logprobs stray from its m=1 reference's, token by token."""

import math
from collections.abc import Sequence
from dataclasses import dataclass

# One position's logprobs: the chosen token's, then its top-N alternatives' (None: not given).
Vector = Sequence[float | None]


@dataclass(frozen=True)
class LogprobParity:
    """Over the agreeing prefix: the largest |difference|, whether every value was bitwise
    equal, and where the first and the largest difference were (None when unmeasured)."""

    max_abs_diff: float | None
    is_bitwise_equal: bool | None
    first_diff_at: int | None = None
    max_diff_at: int | None = None


UNMEASURED = LogprobParity(None, None)


def _same(a: float | None, b: float | None) -> bool:
    # Bitwise: 0.0 and -0.0 differ (the entries hold no NaN: the reader drops non-finite values).
    if a is None or b is None:
        return a is b
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def compare(reference: Sequence[Vector], slot: Sequence[Vector], upto: int) -> LogprobParity:
    """Compare the first `upto` positions; unmeasured if no position had two numbers to compare."""
    worst, worst_at, first_at, compared = 0.0, None, None, 0
    for i, (ref, got) in enumerate(zip(reference[:upto], slot[:upto])):
        if len(ref) != len(got) or not all(_same(a, b) for a, b in zip(ref, got)):
            first_at = i if first_at is None else first_at
        for a, b in zip(ref, got):
            if a is not None and b is not None:
                compared += 1
                diff = abs(a - b)
                if diff > worst:
                    worst, worst_at = diff, i
    if compared == 0:
        return UNMEASURED
    if first_at is not None and worst_at is None:
        worst_at = first_at  # only a None against a number, or a different top-N count
    return LogprobParity(worst, first_at is None, first_at, worst_at)


def combine(slots: Sequence[LogprobParity]) -> LogprobParity:
    """A band's parity: its worst slot's difference; bitwise only if every slot was measured
    and bitwise equal; false as soon as one slot was not."""
    measured = [p for p in slots if p.max_abs_diff is not None]
    if not measured:
        return UNMEASURED
    worst = max(measured, key=lambda p: p.max_abs_diff or 0.0)
    if any(p.is_bitwise_equal is False for p in measured):
        equal: bool | None = False
    else:
        equal = True if len(measured) == len(slots) else None
    return LogprobParity(worst.max_abs_diff, equal, worst.first_diff_at, worst.max_diff_at)
