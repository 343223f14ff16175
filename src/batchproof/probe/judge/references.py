"""The m=1 references: each prompt's runs fired alone, grouped as the mode says (on a fleet, by the
replica that served them), judged for stability and recorded."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from batchproof.probe.judge.fleet import Reply
from batchproof.probe.judge.logprob_parity import UNMEASURED, LogprobParity, combine, compare
from batchproof.probe.judge.mixed_verdict import Reference
from batchproof.probe.judge.verdict import Policy, ReferenceJudgement, Sample, judge_reference, refusal
from batchproof.probe.records.reply import StreamResult


def sample(result: StreamResult) -> Sample:
    identities = [entry.identity for entry in result.entries]
    return Sample(identities, result.completion_tokens, result.error, result.is_early_stop_ok, result.finish_reason)


def as_reference(result: StreamResult) -> Reference:
    return Reference([e.identity for e in result.entries], [e.top2_margin for e in result.entries])


@dataclass(frozen=True)
class AloneGroup:
    """m=1 runs of one prompt judged together: all of them, or on a fleet one replica's."""

    prompt: int
    runs: list[StreamResult]


def judge_runs(runs: Sequence[Sample], policy: Policy) -> ReferenceJudgement | None:
    """The first run against each later one: the first refusal or parting, else the least
    agreement. None for a single complete run: there is nothing to compare it with (a fleet's
    replica the router sent only one alone request)."""
    if len(runs) == 1:
        why = refusal(runs[0], policy.n_predict)
        return None if why is None else ReferenceJudgement(False, runs[0].completion_tokens, None, f"ref#1: {why}")
    least: ReferenceJudgement | None = None
    for k, other in enumerate(runs[1:], start=2):
        judgement = judge_reference(runs[0], other, policy, ("ref#1", f"ref#{k}"))
        if not judgement.is_stable:
            return judgement
        if least is None or (judgement.self_divergence_at or 0) < (least.self_divergence_at or 0):
            least = judgement
    return least


def combined(judgements: Sequence[ReferenceJudgement], labels: Sequence[str] | None = None) -> ReferenceJudgement:
    """The run's reference: stable iff every prompt's is; the least self-agreement; the first
    reason, naming its prompt (or `labels`' entry) when there are several."""
    labels = labels or [f"prompt {i}" for i in range(len(judgements))]
    unstable = [(label, j) for label, j in zip(labels, judgements) if not j.is_stable]
    agreed = [j.self_divergence_at for j in judgements]
    least = None if any(a is None for a in agreed) else min(a for a in agreed if a is not None)
    tokens = judgements[0].tokens
    if not unstable:
        return ReferenceJudgement(True, tokens, least, None)
    label, first = unstable[0]
    reason = first.reason if len(judgements) == 1 else f"{label}: {first.reason}"
    return ReferenceJudgement(False, tokens, least, reason)


def judged_reference(
    judged: Sequence[tuple[AloneGroup, ReferenceJudgement | None]], labels: Sequence[str]
) -> ReferenceJudgement:
    """Every judged group's stability combined, each named by its label (its prompt, and on a fleet
    its replica); a group of one complete run is not judged."""
    counted = [(label, j) for (_, j), label in zip(judged, labels) if j is not None]
    if not counted:
        tokens = judged[0][0].runs[0].completion_tokens
        return ReferenceJudgement(False, tokens, None, "no replica served a prompt alone twice")
    return combined([j for _, j in counted], [label for label, _ in counted])


def judge_alone(
    groups: Sequence[AloneGroup], labels: Sequence[str], policy: Policy
) -> tuple[ReferenceJudgement, list[dict[str, Any]], dict[str, Any]]:
    """(the run's reference, each group's record, the reference's logprob stability)."""
    judged = [(g, judge_runs([sample(run) for run in g.runs], policy)) for g in groups]
    records = [group_record(g, j) for g, j in judged]
    return judged_reference(judged, labels), records, logprob_stability(records)


def group_parity(group: AloneGroup, judgement: ReferenceJudgement | None) -> LogprobParity:
    """The first run's logprobs against each later run's, over the tokens they all share."""
    if judgement is None or len(group.runs) < 2:
        return UNMEASURED
    first, upto = group.runs[0].logprob_vectors(), judgement.self_divergence_at or 0
    return combine([compare(first, other.logprob_vectors(), upto) for other in group.runs[1:]])


def reference_record(reference: ReferenceJudgement) -> dict[str, Any]:
    """The witness's `reference` (v3's keys; the reason only when there is one)."""
    record: dict[str, Any] = {
        "stable": reference.is_stable,
        "tokens": reference.tokens,
        "self_divergence_at": reference.self_divergence_at,
    }
    if reference.reason is not None:
        record["reason"] = reference.reason
    return record


def prompt_reference_record(
    i: int, judgement: ReferenceJudgement | None, parity: LogprobParity, replicas: Sequence[str | None] = (),
    tokens: int | None = None, cached_tokens: Sequence[int | None] = (),
) -> dict[str, Any]:
    """One prompt's reference in the witness, with how far its runs' logprobs differ (and from
    which token), the replica that served each run and the prompt tokens each was served from the
    server's cache; `stable` null when one run had nothing to be compared with."""
    if judgement is None:
        record: dict[str, Any] = {"stable": None, "tokens": tokens, "self_divergence_at": None,
                                  "reason": "served alone once: its self-consistency is untested"}
    else:
        record = reference_record(judgement)
    return {"prompt": i, **record, "logprob_max_abs_diff": parity.max_abs_diff,
            "logprobs_bitwise_equal": parity.is_bitwise_equal, "logprob_first_diff_at": parity.first_diff_at,
            "replicas": list(replicas), "cached_tokens": list(cached_tokens)}


def group_record(group: AloneGroup, judgement: ReferenceJudgement | None) -> dict[str, Any]:
    return prompt_reference_record(group.prompt, judgement, group_parity(group, judgement),
                                   [run.replica for run in group.runs], group.runs[0].completion_tokens,
                                   [run.cached_tokens for run in group.runs])


def logprob_stability(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The reference on logprobs, as the witness's `reference` adds it: the runs of one request
    served alone must agree on every logprob, or no band's difference can be blamed on batching.
    Names the worst prompt's difference, where it starts and, when the later run was served from
    the server's cache and the first was not, says so."""
    measured = [r for r in records if r["logprobs_bitwise_equal"] is not None]
    if not measured:
        return {"logprobs_stable": None, "logprob_max_abs_diff": None, "logprob_first_diff_at": None,
                "logprob_reason": None}
    unstable = [r for r in measured if r["logprobs_bitwise_equal"] is False]
    if not unstable:
        return {"logprobs_stable": True, "logprob_max_abs_diff": max(r["logprob_max_abs_diff"] for r in measured),
                "logprob_first_diff_at": None, "logprob_reason": None}
    worst = max(unstable, key=lambda r: r["logprob_max_abs_diff"] or 0.0)
    where = f" (prompt {worst['prompt']})" if len({r["prompt"] for r in records}) > 1 else ""
    size, at = worst["logprob_max_abs_diff"], worst["logprob_first_diff_at"]
    reason = f"reference: logprobs of two alone runs differ by {size:.3g} at token {at}{where}"
    cached = worst.get("cached_tokens") or []
    if len(cached) >= 2 and not cached[0] and any(cached[1:]):
        reason += f"; the later run was served {max(n or 0 for n in cached[1:])} prompt tokens from the server's cache"
    return {"logprobs_stable": False, "logprob_max_abs_diff": size, "logprob_first_diff_at": at,
            "logprob_reason": reason}


def fleet_replies(alone: list[list[StreamResult]], n_predict: int) -> list[Reply]:
    """Every m=1 run as the fleet compares them (a refused run carries no entries)."""
    return [Reply(p, run.replica, run.entries if refusal(sample(run), n_predict) is None else None)
            for p, runs in enumerate(alone) for run in runs]
