"""The probe's judgement as pure functions over plain lists: agreement, runs, verdicts, rates."""

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

Result = Literal["PASS", "FAIL", "UNMEASURABLE"]


@dataclass(frozen=True)
class Policy:
    n_predict: int
    declared_min: int
    max_constant_run: int


@dataclass(frozen=True)
class Sample:
    """One request's reply, reduced to what the verdict reads."""

    identities: Sequence[Hashable]
    completion_tokens: int | None
    error: str | None = None
    # Without `ignore_eos` (a server that refused it), a reply may end at its own end of
    # sequence: it is then complete at its own length and compared over it.
    is_early_stop_ok: bool = False
    finish_reason: str | None = None

    @property
    def ended_early(self) -> bool:
        return self.is_early_stop_ok and self.finish_reason == "stop"


@dataclass(frozen=True)
class ReferenceJudgement:
    is_stable: bool
    tokens: int | None
    self_divergence_at: int | None
    reason: str | None


@dataclass(frozen=True)
class BandJudgement:
    result: Result
    reason: str | None
    divergence_at: int | None = None
    top2_margin_at_divergence: float | None = None
    intra_agree_to: int | None = None
    max_constant_run: int | None = None


def intern(streams: Sequence[Sequence[Hashable]]) -> list[list[int]]:
    """Token identities as ids, numbered in first-seen order over all the streams."""
    ids: dict[Hashable, int] = {}
    return [[ids.setdefault(token, len(ids)) for token in stream] for stream in streams]


def agreement(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """How many leading tokens two streams share (the shorter length if they never part)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def longest_constant_run(ids: Sequence[Hashable]) -> int:
    """The longest run of one repeated token; 0 for an empty stream."""
    best = run = 0
    for i, token in enumerate(ids):
        run = run + 1 if i and token == ids[i - 1] else 1
        best = max(best, run)
    return best


def refusal(sample: Sample, n_predict: int) -> str | None:
    """Why a reply cannot be compared, or None: it must hold exactly n_predict tokens (or, one
    that ended early where that is allowed, as many entries as it says it generated)."""
    if sample.error is not None:
        return sample.error
    tokens = sample.completion_tokens
    if sample.ended_early and isinstance(tokens, int) and 0 < tokens <= n_predict:
        if len(sample.identities) != tokens:
            return f"{len(sample.identities)} logprob entries != completion_tokens={tokens}"
        return None
    if tokens != n_predict:
        return f"completion_tokens={tokens} != n_predict={n_predict}"
    if len(sample.identities) != n_predict:
        return f"{len(sample.identities)} logprob entries != n_predict={n_predict}"
    return None


def agrees_enough(agree: int, len_a: int, len_b: int, declared_min: int) -> bool:
    """declared_min tokens of agreement; or two replies that ended early at the same token
    and agreed all the way (a shorter reply cannot show more)."""
    return agree >= declared_min or agree == len_a == len_b


def judge_reference(
    first: Sample, second: Sample, policy: Policy, labels: tuple[str, str] = ("ref#1", "ref#2")
) -> ReferenceJudgement:
    """Two m=1 replies: stable iff both are complete and agree for declared_min tokens."""
    for label, sample in zip(labels, (first, second)):
        why = refusal(sample, policy.n_predict)
        if why is not None:
            return ReferenceJudgement(False, first.completion_tokens, None, f"{label}: {why}")
    agree = agreement(*intern([first.identities, second.identities]))
    if not agrees_enough(agree, len(first.identities), len(second.identities), policy.declared_min):
        runs = "the two m=1 runs" if labels == ("ref#1", "ref#2") else f"m=1 runs {labels[0]} and {labels[1]}"
        why = (
            f"{runs} part at token {agree} < declared_min {policy.declared_min}: "
            "a server that is not deterministic alone cannot be judged in batches"
        )
        return ReferenceJudgement(False, first.completion_tokens, agree, why)
    return ReferenceJudgement(True, first.completion_tokens, agree, None)


def band_refusal(c: int, m_formed: int, slots: Sequence[Sample], n_predict: int) -> str | None:
    """Why a band cannot be compared at all, or None."""
    if len(slots) != c:
        return f"fired c={c} requests, {len(slots)} came back"
    if not slots:
        return "no request was fired"
    refused = [(i, refusal(s, n_predict)) for i, s in enumerate(slots)]
    reasons = [f"slot {i}: {why}" for i, why in refused if why is not None]
    if reasons:
        return "; ".join(reasons)
    if c > 1 and m_formed < 2:
        return (
            f"no batch with m>1 formed (m_formed={m_formed}): "
            "the batched path was never exercised"
        )
    return None


def slot_divergence(
    reference: Sequence[Hashable], reference_margins: Sequence[float | None], slot: Sequence[Hashable]
) -> tuple[int, float | None]:
    """Where `slot` leaves its m=1 reference (the shorter length if never), and the
    reference's top-2 margin there, only when the streams part."""
    ref_ids, slot_ids = intern([reference, slot])
    divergence = agreement(ref_ids, slot_ids)
    parted = divergence < min(len(ref_ids), len(slot_ids))
    margin = reference_margins[divergence] if parted and divergence < len(reference_margins) else None
    return divergence, margin


def judge_band(
    c: int,
    m_formed: int,
    reference: Sequence[Hashable],
    reference_margins: Sequence[float | None],
    slots: Sequence[Sample],
    policy: Policy,
) -> BandJudgement:
    """One band's verdict; divergence from m=1 is recorded here, judged by the shape check."""
    why = band_refusal(c, m_formed, slots, policy.n_predict)
    if why is not None:
        return BandJudgement("UNMEASURABLE", why)
    slot_ids = intern([s.identities for s in slots])
    divergence, margin = slot_divergence(reference, reference_margins, slots[0].identities)
    agree = [agreement(ids, slot_ids[0]) for ids in slot_ids]
    runs = [longest_constant_run(ids) for ids in slot_ids]
    result, reason = _band_result(slot_ids, agree, runs, policy, [s.ended_early for s in slots])
    return BandJudgement(result, reason, divergence, margin, min(agree), max(runs))


def frozen_or_short(
    slot_ids: Sequence[Sequence[Hashable]], runs: list[int], policy: Policy, ended: Sequence[bool] = ()
) -> tuple[Result, str] | None:
    """FAIL for a frozen slot, UNMEASURABLE for one too short to judge (one that ended at its
    own end of sequence, where allowed, is judged over its length), else None."""
    frozen = [i for i, run in enumerate(runs) if run >= policy.max_constant_run]
    if frozen:
        i = frozen[0]
        return "FAIL", (
            f"slot {i} repeated one token {runs[i]} times "
            f"(max_constant_run {policy.max_constant_run}): a frozen slot"
        )
    short = [i for i, ids in enumerate(slot_ids)
             if len(ids) < policy.declared_min and not (i < len(ended) and ended[i])]
    if short:
        i = short[0]
        return "UNMEASURABLE", (
            f"slot {i} has {len(slot_ids[i])} tokens < declared_min {policy.declared_min}"
        )
    return None


def _band_result(
    slot_ids: list[list[int]], agree: list[int], runs: list[int], policy: Policy, ended: Sequence[bool]
) -> tuple[Result, str | None]:
    failed = frozen_or_short(slot_ids, runs, policy, ended)
    if failed is not None:
        return failed
    worst = min(range(len(agree)), key=agree.__getitem__)
    if not agrees_enough(agree[worst], len(slot_ids[worst]), len(slot_ids[0]), policy.declared_min):
        return "FAIL", (
            f"slots of one batch disagree: slot {worst} parts from slot 0 at token "
            f"{agree[worst]} < declared_min {policy.declared_min}"
        )
    return "PASS", None


def run_verdict(is_reference_stable: bool, bands: Sequence[tuple[int, Result]]) -> Result:
    """FAIL on any failed band; PASS only with a stable reference and a clean c>1 band."""
    results = [result for _, result in bands]
    if "FAIL" in results:
        return "FAIL"
    if not is_reference_stable or "UNMEASURABLE" in results:
        return "UNMEASURABLE"
    if not any(c > 1 for c, _ in bands):
        return "UNMEASURABLE"
    return "PASS"


def median(values: Sequence[float]) -> float | None:
    """The median (mean of the middle two for an even count); None when empty."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return None
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def band_rate(rates: Sequence[float | None]) -> float | None:
    """A band's decode rate: the median of its slots', or None if any slot is untimed."""
    timed = [r for r in rates if r is not None]
    return median(timed) if len(timed) == len(rates) else None
