"""A mixed band's verdict: each slot against its own prompt's m=1 reference, the band by its worst slot."""

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from batchproof.probe.judge.verdict import (
    BandJudgement,
    Policy,
    Sample,
    band_refusal,
    frozen_or_short,
    intern,
    longest_constant_run,
    slot_divergence,
)


@dataclass(frozen=True)
class Reference:
    """One prompt's m=1 reply, as the verdict reads it."""

    identities: Sequence[Hashable]
    margins: Sequence[float | None]


def worst_slot(divergences: Sequence[tuple[int, float | None]]) -> int:
    """The slot that parts earliest; at a tie, the one least explained by a near-tie
    (no margin first, then the widest margin), so the band never hides its worst case."""
    def badness(i: int) -> tuple[int, int, float]:
        at, margin = divergences[i]
        return (at, 0 if margin is None else 1, -(margin or 0.0))

    return min(range(len(divergences)), key=badness)


def judge_mixed_band(
    c: int,
    m_formed: int,
    references: Sequence[Reference],
    slots: Sequence[Sample],
    policy: Policy,
) -> tuple[BandJudgement, list[tuple[int, float | None]], int | None]:
    """(the band's judgement, each slot's (divergence_at, margin), the worst slot).

    Slots answer different prompts, so they are not compared with each other:
    `intra_agree_to` records the least agreement of any slot with its own reference, and
    the band's `divergence_at` and margin are its worst slot's. As in identical mode, the
    divergence is recorded here and judged by the shape check.
    """
    why = band_refusal(c, m_formed, slots, policy.n_predict)
    if why is not None:
        return BandJudgement("UNMEASURABLE", why), [], None
    divergences = [
        slot_divergence(ref.identities, ref.margins, slot.identities) for ref, slot in zip(references, slots)
    ]
    worst = worst_slot(divergences)
    slot_ids = intern([s.identities for s in slots])
    runs = [longest_constant_run(ids) for ids in slot_ids]
    failed = frozen_or_short(slot_ids, runs, policy, [s.ended_early for s in slots])
    result, reason = failed if failed is not None else ("PASS", None)
    at, margin = divergences[worst]
    return BandJudgement(result, reason, at, margin, at, max(runs)), divergences, worst
