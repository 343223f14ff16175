"""notary/metrics.py against each framework's definition computed by hand on two small rollouts,
the truncation counts, near ties and the top-1 disagreements they explain."""

import math

import pytest

from batchproof.notary.metrics import Scored, Settings, histogram_labels, report
from batchproof.notary.records import Rollout

# Two rollouts: claims (the rollout engine's) against ours (the trainer's role).
CLAIMED = [[-0.5, -1.0, -2.0], [-0.1]]
OURS = [[-0.5, -1.5, -1.0], [-0.1]]


def _report(settings: Settings | None = None, top=None, top_logprobs=None) -> dict:
    rollouts = [Rollout("line 1", [1], [10, 11, 12], CLAIMED[0], top_logprobs),
                Rollout("line 2", [1], [13], CLAIMED[1])]
    top = top or [[((10, -0.5), (7, -3.0)), ((9, -0.9), (11, -1.5)), ((12, -1.0), (5, -1.1))],
                  [((13, -0.1), (2, -9.0))]]
    return report(rollouts, [Scored(o, t) for o, t in zip(OURS, top)], settings or Settings(), [], {})


def test_each_frameworks_metric_as_it_defines_it():
    got = _report()["frameworks"]
    deltas = [c - o for cs, os_ in zip(CLAIMED, OURS) for c, o in zip(cs, os_)]  # 0, 0.5, -1, 0
    log_r = [-d for d in deltas]
    probs = [abs(math.exp(c) - math.exp(o)) for cs, os_ in zip(CLAIMED, OURS) for c, o in zip(cs, os_)]
    k3 = [math.exp(x) - x - 1 for x in log_r]
    assert got["verl"]["training/rollout_probs_diff_mean"] == pytest.approx(sum(probs) / 4)
    assert got["verl"]["training/rollout_probs_diff_max"] == pytest.approx(max(probs))
    # slime: a mean per sample, then over samples (not over tokens)
    assert got["slime"]["train/train_rollout_logprob_abs_diff"] == pytest.approx((1.5 / 3 + 0) / 2)
    # prime-rl: k3 averaged per sequence, then over sequences; NeMo RL: over all tokens
    assert got["prime-rl"]["mismatch_kl/mean"] == pytest.approx((sum(k3[:3]) / 3 + k3[3]) / 2)
    assert got["nemo-rl"]["train/gen_kl_error"] == pytest.approx(sum(k3) / 4)
    assert got["nemo-rl"]["train/token_mult_prob_error"] == pytest.approx(sum(math.exp(abs(d)) for d in deltas) / 4)
    assert got["trl"]["sampling/sampling_logp_difference/mean"] == pytest.approx(1.5 / 4)
    assert got["trl"]["sampling/sampling_logp_difference/max"] == 1.0
    assert got["trl"]["sampling/importance_sampling_ratio/max"] == pytest.approx(math.e)
    assert got["trl"]["sampling/importance_sampling_ratio/min"] == pytest.approx(math.exp(-0.5))


def test_summary_truncation_and_positions():
    rep = _report()
    summary = rep["summary"]
    assert (summary["num_tokens"], summary["num_exact_tokens"], summary["num_exact_rollouts"]) == (4, 2, 1)
    assert not summary["all_exact"] and summary["max_abs_diff"] == 1.0
    first, second = rep["rollouts"]
    assert first["first_divergent_position"] == 1 and second["first_divergent_position"] is None
    tis = {t["cap"]: t["tokens_truncated"] for t in rep["truncation"]["tis"]}
    assert tis == {2.0: 1, 3.0: 0}  # e^1 > 2 only
    mis = rep["truncation"]["mis"]
    assert mis["tokens_masked"] == 1 and mis["sequences_with_a_masked_token"] == 1  # e^1 outside [0.5, 2]
    assert [p["num_tokens"] for p in rep["by_position"]] == [2, 1, 1]
    assert rep["by_position"][0]["max_abs_diff"] == 0.0 and rep["by_position"][2]["mean_abs_diff"] == 1.0
    counts = {b["bin"]: b["count"] for b in rep["importance_ratio"]["log_ratio_histogram"]}
    assert list(counts) == histogram_labels() and counts["0 (exact)"] == 2 and sum(counts.values()) == 4


def test_near_ties_explain_a_flipped_top_choice():
    """Position 1: they claim token 11 at p > 1/2 (so it is their top choice); our top is 9, by 0.6
    nats over 11: a disagreement no near tie explains at 0.05, and one at 1. Position 2: our top 2
    are 0.1 apart, a near tie at 0.2."""
    strict, loose = _report(Settings(near_tie=0.05)), _report(Settings(near_tie=1.0))
    assert strict["rollouts"][0]["near_ties"] == [] and loose["rollouts"][0]["near_ties"] == [1, 2]
    # -1.0 claimed is below log(1/2): not provably their top; give them alternatives instead.
    with_top = _report(Settings(near_tie=0.7), top_logprobs=[None, {11: -0.6, 9: -0.9}, None])
    (flip,) = with_top["rollouts"][0]["disagreements"]
    assert flip == {"position": 1, "claimed_top1": 11, "our_top1": 9, "our_margin": pytest.approx(0.6),
                    "explained_by_near_tie": True}
    assert with_top["summary"]["num_disagreements_explained_by_near_ties"] == 1


def test_a_huge_gap_stays_finite():
    rollouts = [Rollout("line 1", [1], [2], [-9999.0])]
    rep = report(rollouts, [Scored([-0.001], [((2, -0.001), (3, -7.0))])], Settings(), [], {})
    assert math.isfinite(rep["frameworks"]["trl"]["sampling/importance_sampling_ratio/max"])
    assert math.isfinite(rep["frameworks"]["nemo-rl"]["train/gen_kl_error"])


@pytest.mark.parametrize("band", [(0.0, 2.0), (1.5, 2.0), (0.5, 0.9)])
def test_settings_refuse_a_band_without_one(band):
    with pytest.raises(ValueError, match="band"):
        Settings(mask_band=band)
