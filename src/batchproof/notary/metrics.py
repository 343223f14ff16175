"""The gap between an engine's claimed logprobs and ours, per rollout and overall, in each RL
framework's own metric names and definitions (docs/notary.md cites each), with the importance
ratios a trainer would weight by and how much truncation or masking would act on them.

Sign conventions are the frameworks': our score plays the trainer's part (the reference), the
claim the rollout engine's, so the importance ratio is r = exp(ours - claimed) = pi_train / pi_rollout
and the k3 estimate of KL(pi_rollout || pi_train) is r - log r - 1 per token (prime-rl's
`mismatch_kl`, NeMo RL's `gen_kl_error` under its default k3). Pure Python, summed with fsum in
list order, so a report is the same bits on any machine."""

import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from batchproof.notary.records import Rollout
from batchproof.notary.routes import Routes, compare_routes
from batchproof.notary.settings import Settings

MAX_EXP = 709.0  # exp() of more overflows a float: ratios past e^709 are reported as e^709


@dataclass(frozen=True)
class Scored:
    """What our engine said at each completion position: the token's logprob and our top 2."""

    logprobs: list[float]
    top: list[tuple[tuple[int, float], ...]]  # per position, (id, logprob) best first
    routes: Routes | None = None  # our MoE routing of every fed position, where the rollout claimed one


def _exp(x: float) -> float:
    return math.exp(min(x, MAX_EXP))


def _k3(log_ratio: float) -> float:
    # capped with the ratio: past e^709 the log would outgrow the capped ratio and turn k3 negative
    return _exp(log_ratio) - min(log_ratio, MAX_EXP) - 1.0


def _mean(values: list[float]) -> float:
    if not values:
        return 0.0
    try:
        return math.fsum(values) / len(values)
    except OverflowError:  # a sum past the float range (three ratios at e^709: vLLM's -9999 claims)
        pass
    # The mean is within it: each share divided first, and halved (exactly) so that shares
    # rounded up cannot pass the range again; a mean at the very top is the largest float.
    half = math.fsum(v / 2 / len(values) for v in values)
    mean = 2 * half
    return mean if math.isfinite(mean) else math.copysign(sys.float_info.max, half)


def _sum(values: list[float]) -> float:
    """fsum, a sum past the float range reported as the largest float of its sign (as a ratio
    past e^709 is reported as e^709): JSON holds no infinity."""
    try:
        return math.fsum(values)
    except OverflowError:
        return math.copysign(sys.float_info.max, _mean(values))


@dataclass
class RolloutGap:
    """One rollout's comparison (as report.json's `rollouts[i]`)."""

    where: str
    rollout_id: str | None
    num_tokens: int
    num_exact: int
    first_divergent_position: int | None
    mean_abs_diff: float
    max_abs_diff: float
    probs_diff_mean: float
    probs_diff_max: float
    mismatch_kl: float
    log_ratio_sum: float
    geo_mean_ratio: float
    abs_diffs: list[float]
    log_ratios: list[float]
    probs_diffs: list[float]
    near_ties: list[int] = field(default_factory=list)
    disagreements: list[dict] = field(default_factory=list)
    routing: dict | None = None  # where a claimed MoE routing parts from ours (routes.compare_routes)

    def as_json(self) -> dict:
        data = dict(self.__dict__)
        data.pop("log_ratios")  # the overall distribution shows them
        data.pop("probs_diffs")
        if data["routing"] is None:  # no routing claimed: the report reads as before
            data.pop("routing")
        return data


def rollout_gap(rollout: Rollout, scored: Scored, settings: Settings) -> RolloutGap:
    claimed, ours = rollout.logprobs, scored.logprobs
    diffs = [c - o for c, o in zip(claimed, ours, strict=True)]
    abs_diffs = [abs(d) for d in diffs]
    log_ratios = [o - c for c, o in zip(claimed, ours)]
    probs_diffs = [abs(_exp(c) - _exp(o)) for c, o in zip(claimed, ours)]
    first = next((i for i, d in enumerate(diffs) if d != 0.0), None)
    log_ratio_sum = _sum(log_ratios)
    gap = RolloutGap(
        where=rollout.where, rollout_id=rollout.rollout_id, num_tokens=len(claimed),
        num_exact=sum(d == 0.0 for d in diffs), first_divergent_position=first,
        mean_abs_diff=_mean(abs_diffs), max_abs_diff=max(abs_diffs, default=0.0),
        probs_diff_mean=_mean(probs_diffs), probs_diff_max=max(probs_diffs, default=0.0),
        mismatch_kl=_mean([_k3(x) for x in log_ratios]), log_ratio_sum=log_ratio_sum,
        geo_mean_ratio=_exp(_mean(log_ratios)) if log_ratios else 1.0,
        abs_diffs=abs_diffs, log_ratios=log_ratios, probs_diffs=probs_diffs)
    _ties_and_disagreements(gap, rollout, scored, settings)
    if rollout.routed_experts is not None and scored.routes is not None:
        gap.routing = compare_routes(rollout.routed_experts, scored.routes, len(rollout.prompt_token_ids))
    return gap


def _claimed_top1(rollout: Rollout, i: int) -> int | None:
    """The claimant's most likely token at position i: from its alternatives, else the token
    itself where its claimed probability passes one half (no other token can then beat it)."""
    if rollout.top_logprobs is not None and rollout.top_logprobs[i]:
        row = rollout.top_logprobs[i]
        return min(row, key=lambda t: (-row[t], t))
    if rollout.logprobs[i] > -math.log(2):
        return rollout.completion_token_ids[i]
    return None


def _ties_and_disagreements(gap: RolloutGap, rollout: Rollout, scored: Scored, settings: Settings) -> None:
    for i, top in enumerate(scored.top):
        margin = top[0][1] - top[1][1] if len(top) >= 2 else math.inf
        if margin <= settings.near_tie:
            gap.near_ties.append(i)
        theirs = _claimed_top1(rollout, i)
        if theirs is None or theirs == top[0][0]:
            continue
        # Our logprob of their choice, where we know it: our second, or the token scored.
        known = dict(top)
        if rollout.completion_token_ids[i] == theirs:
            known[theirs] = scored.logprobs[i]
        ours_of_theirs = known.get(theirs)
        to_theirs = None if ours_of_theirs is None else top[0][1] - ours_of_theirs
        gap.disagreements.append({
            "position": i, "claimed_top1": theirs, "our_top1": top[0][0],
            "our_margin": to_theirs,  # our top-1's logprob minus theirs, in nats (None: past our top 2)
            "explained_by_near_tie": to_theirs is not None and to_theirs <= settings.near_tie,
        })


# The frameworks' names for the gap, each with how it is computed from these rollouts.
FRAMEWORK_DEFINITIONS = {
    "verl": "training/rollout_probs_diff_{mean,max,std}: |exp(rollout logprob) - exp(actor logprob)| over "
            "response tokens (ray_trainer.py)",
    "slime": "train/train_rollout_logprob_abs_diff: |old logprob - rollout logprob|, averaged in each sample "
             "then over samples (sum_of_sample_mean, backends/megatron_utils/loss.py)",
    "prime-rl": "mismatch_kl/mean: per sequence, the mean over its tokens of r - log r - 1 with "
                "log r = trainer - inference logprob; then over sequences (trainer/rl/loss.py)",
    "nemo-rl": "train/gen_kl_error: KL(P_gen || P_train), k3 of log r = prev - generation logprob, averaged "
               "over all tokens; train/token_mult_prob_error: mean of exp(|generation - prev logprob|) "
               "(algorithms/loss_functions.py)",
    "trl": "sampling/sampling_logp_difference/{mean,max}: |old - sampling per-token logp| over completion "
           "tokens; sampling/importance_sampling_ratio/{min,mean,max}: exp(old - sampling) (grpo_trainer.py)",
}


def framework_metrics(gaps: list[RolloutGap]) -> dict[str, dict[str, float]]:
    abs_diffs = [d for g in gaps for d in g.abs_diffs]
    log_ratios = [x for g in gaps for x in g.log_ratios]
    probs_diffs = [p for g in gaps for p in g.probs_diffs]
    ratios = [_exp(x) for x in log_ratios]
    with_tokens = [g for g in gaps if g.num_tokens]
    return {
        "verl": {"training/rollout_probs_diff_mean": _mean(probs_diffs),
                 "training/rollout_probs_diff_max": max(probs_diffs, default=0.0),
                 "training/rollout_probs_diff_std": statistics.stdev(probs_diffs) if len(probs_diffs) > 1 else 0.0},
        "slime": {"train/train_rollout_logprob_abs_diff": _mean([g.mean_abs_diff for g in with_tokens])},
        "prime-rl": {"mismatch_kl/mean": _mean([g.mismatch_kl for g in with_tokens])},
        "nemo-rl": {"train/gen_kl_error": _mean([_k3(x) for x in log_ratios]),
                    "train/token_mult_prob_error": _mean([_exp(d) for d in abs_diffs]) if abs_diffs else 1.0},
        "trl": {"sampling/sampling_logp_difference/mean": _mean(abs_diffs),
                "sampling/sampling_logp_difference/max": max(abs_diffs, default=0.0),
                "sampling/importance_sampling_ratio/min": min(ratios, default=1.0),
                "sampling/importance_sampling_ratio/mean": _mean(ratios) if ratios else 1.0,
                "sampling/importance_sampling_ratio/max": max(ratios, default=1.0)},
    }


# log r bins for the ratio histogram: exact (0) alone, then decades of |log r| each side.
DECADES = (1e-6, 1e-4, 1e-2, 1e-1, 1.0)


def _decade_label(sign: str, j: int) -> str:
    if j == len(DECADES):
        return f"{sign}({DECADES[-1]:g}, inf)"
    return f"{sign}({DECADES[j - 1] if j else 0:g}, {DECADES[j]:g}]"


def _bin_label(log_ratio: float) -> str:
    if log_ratio == 0.0:
        return "0 (exact)"
    size = abs(log_ratio)
    j = next((j for j, d in enumerate(DECADES) if size <= d), len(DECADES))
    return _decade_label("+" if log_ratio > 0 else "-", j)


def histogram_labels() -> list[str]:
    """log r bins, most negative first: -|log r| by decade, exact, then +|log r| by decade."""
    negatives = [_decade_label("-", j) for j in reversed(range(len(DECADES) + 1))]
    positives = [_decade_label("+", j) for j in range(len(DECADES) + 1)]
    return negatives + ["0 (exact)"] + positives


def _quantile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank quantile (a value that occurs: no interpolation to explain)."""
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def ratio_distribution(gaps: list[RolloutGap]) -> dict:
    log_ratios = sorted(x for g in gaps for x in g.log_ratios)
    counts = dict.fromkeys(histogram_labels(), 0)
    for x in log_ratios:
        counts[_bin_label(x)] += 1
    quantiles = {} if not log_ratios else {
        name: _exp(_quantile(log_ratios, q)) for name, q in
        (("min", 0.0), ("p1", 0.01), ("p5", 0.05), ("p25", 0.25), ("p50", 0.5), ("p75", 0.75), ("p95", 0.95),
         ("p99", 0.99), ("max", 1.0))}
    return {"ratio": "exp(ours - claimed) per token (pi_train / pi_rollout)", "quantiles": quantiles,
            "log_ratio_histogram": [{"bin": label, "count": n} for label, n in counts.items()]}


def truncation(gaps: list[RolloutGap], settings: Settings) -> dict:
    """How much each correction would act: tokens TIS would cut, tokens and sequences MIS
    (rejection) would drop."""
    log_ratios = [x for g in gaps for x in g.log_ratios]
    num = max(len(log_ratios), 1)
    low, high = settings.mask_band
    with_tokens = [g for g in gaps if g.num_tokens]

    def outside(r: float) -> bool:
        return r < low or r > high

    return {
        "tis": [{"cap": c, "tokens_truncated": sum(_exp(x) > c for x in log_ratios),
                 "fraction": sum(_exp(x) > c for x in log_ratios) / num} for c in settings.tis_caps],
        "mis": {"band": [low, high],
                "tokens_masked": sum(outside(_exp(x)) for x in log_ratios),
                "token_fraction": sum(outside(_exp(x)) for x in log_ratios) / num,
                # a sequence is dropped whole when any token falls outside (prime-rl's seq masks)
                "sequences_with_a_masked_token": sum(any(outside(_exp(x)) for x in g.log_ratios) for g in with_tokens),
                # or when its geometric-mean ratio does (verl's geometric mode, prime-rl's geo masks)
                "sequences_geo_masked": sum(outside(g.geo_mean_ratio) for g in with_tokens),
                "num_sequences": len(with_tokens)},
    }


def by_position(gaps: list[RolloutGap]) -> list[dict]:
    """|delta| at each completion position, over the rollouts that reach it."""
    longest = max((g.num_tokens for g in gaps), default=0)
    rows = []
    for i in range(longest):
        values = [g.abs_diffs[i] for g in gaps if i < g.num_tokens]
        rows.append({"position": i, "num_tokens": len(values), "mean_abs_diff": _mean(values),
                     "max_abs_diff": max(values)})
    return rows


def summary(gaps: list[RolloutGap], settings: Settings) -> dict:
    abs_diffs = [d for g in gaps for d in g.abs_diffs]
    log_ratios = [x for g in gaps for x in g.log_ratios]
    num_tokens = len(abs_diffs)
    num_exact = sum(g.num_exact for g in gaps)
    disagreements = [d for g in gaps for d in g.disagreements]
    routed = [g.routing for g in gaps if g.routing is not None]
    return {
        "num_rollouts": len(gaps), "num_tokens": num_tokens, "num_exact_tokens": num_exact,
        "num_exact_rollouts": sum(g.num_exact == g.num_tokens for g in gaps),
        "all_exact": num_exact == num_tokens,
        "mean_abs_diff": _mean(abs_diffs), "max_abs_diff": max(abs_diffs, default=0.0),
        "k3_kl": _mean([_k3(x) for x in log_ratios]),
        "num_divergent_rollouts": sum(g.first_divergent_position is not None for g in gaps),
        "num_near_ties": sum(len(g.near_ties) for g in gaps), "near_tie_nats": settings.near_tie,
        "num_top1_disagreements": len(disagreements),
        "num_disagreements_explained_by_near_ties": sum(d["explained_by_near_tie"] for d in disagreements),
        # only where a rollout claimed its MoE routing (routes.py)
        **({"num_routed_rollouts": len(routed), "num_routing_mismatches": sum(not r["matches"] for r in routed)}
           if routed else {}),
    }


def report(rollouts: list[Rollout], scores: list[Scored], settings: Settings, bad_lines: list[dict],
           engine_info: dict, aborted: Sequence[Rollout] = ()) -> dict:
    """report.json: everything the page shows, and each rollout's own comparison. `aborted`: the
    rollouts an abort ended before they were scored (over HTTP: /abort_requests, /pause), listed
    apart, as a chat reply cut by one ends with finish_reason "abort"; the metrics are the rest's."""
    gaps = [rollout_gap(r, s, settings) for r, s in zip(rollouts, scores, strict=True)]
    return {
        "finish_reason": "abort" if aborted else "stop",
        "summary": {**summary(gaps, settings), "num_bad_records": len(bad_lines), "num_aborted_rollouts": len(aborted)},
        "aborted": [{"where": r.where, "rollout_id": r.rollout_id, "finish_reason": "abort"} for r in aborted],
        "frameworks": framework_metrics(gaps),
        "definitions": FRAMEWORK_DEFINITIONS,
        "importance_ratio": ratio_distribution(gaps),
        "truncation": truncation(gaps, settings),
        "by_position": by_position(gaps),
        "rollouts": [g.as_json() for g in gaps],
        "bad_records": bad_lines,
        "engine": engine_info,
        "settings": {"near_tie": settings.near_tie, "tis_caps": list(settings.tis_caps),
                     "mask_band": list(settings.mask_band), "replay_routing": settings.replay_routing},
    }
