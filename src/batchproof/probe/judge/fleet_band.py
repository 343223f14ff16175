"""A band on a fleet: each slot against its own replica's m=1 reply, and only slots one replica
batched together compared with each other (slots on two replicas were never one batch)."""

from collections.abc import Hashable, Sequence
from dataclasses import replace

from batchproof.probe.judge.mixed_verdict import Reference, judge_mixed_band
from batchproof.probe.judge.verdict import BandJudgement, Policy, Sample, agreement, intern


def within_replicas(slot_ids: Sequence[Sequence[Hashable]], replicas: Sequence[str | None]) -> list[tuple[int, int]]:
    """Per slot: (the first slot of the band its replica served, their agreement)."""
    first: dict[str | None, int] = {}
    return [(j := first.setdefault(r, i), agreement(ids, slot_ids[j]))
            for i, (ids, r) in enumerate(zip(slot_ids, replicas))]


def judge_fleet_band(
    c: int,
    m_formed: int,
    references: Sequence[Reference],
    slots: Sequence[Sample],
    replicas: Sequence[str | None],
    policy: Policy,
) -> tuple[BandJudgement, int | None]:
    """(the band's judgement, its worst slot) for identical requests. As a mixed band: the worst
    slot's divergence from its own replica's reference is recorded, and a frozen slot fails. The
    slots one replica served must also agree with each other to declared_min, as in a single
    server's band; `intra_agree_to` is then the least such agreement. (Mixed prompts on a fleet are
    judged as a mixed band: slots asking different prompts are never compared with each other.)"""
    judgement, divergences, worst = judge_mixed_band(c, m_formed, references, slots, policy)
    if not divergences:
        return judgement, worst
    pairs = within_replicas(intern([s.identities for s in slots]), replicas)
    i = min(range(len(pairs)), key=lambda k: pairs[k][1])
    j, intra = pairs[i]
    result, reason = judgement.result, judgement.reason
    if result == "PASS" and intra < policy.declared_min:
        result, reason = "FAIL", (
            f"slots of one batch disagree: slot {i} parts from slot {j} (both on replica {replicas[i]}) "
            f"at token {intra} < declared_min {policy.declared_min}"
        )
    return replace(judgement, result=result, reason=reason, intra_agree_to=intra), worst
