"""`batchproof verify-rollouts`: our own rollouts (sampled through our server, as a trainer takes
them) come out exact in every framework's metric; a rollout whose claims were nudged comes out
with that gap where it was put; bad lines are named by number, on stderr and in the report, and
the rest go on."""

import argparse
import json
import math

import pytest

from batchproof.commands import verify_rollouts
from tests.helpers.live_server import live_server
from tests.helpers.rollouts import own_rollouts


@pytest.fixture(scope="module")
def own(engine) -> list[dict]:
    with live_server(engine) as live:  # closed before the command drives the engine itself
        return own_rollouts(live.url)


def _run(engine, tmp_path, lines: list[str]) -> dict:
    path = tmp_path / "rollouts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    args = argparse.Namespace(file=path, out=tmp_path / "out", model=None, device="cpu", near_tie=0.05,
                              tis_cap=None, mask_band=(0.5, 2.0), quiet=True)
    assert verify_rollouts.run(args, engine=engine) == 0
    return json.loads((tmp_path / "out" / "report.json").read_text())


def test_our_own_rollouts_are_exact_in_every_frameworks_terms(engine, own, tmp_path):
    report = _run(engine, tmp_path, [json.dumps(r) for r in own])
    summary = report["summary"]
    assert summary["num_rollouts"] == len(own) and summary["num_bad_records"] == 0
    assert summary["num_tokens"] == sum(len(r["completion_token_ids"]) for r in own) > 0
    assert summary["all_exact"] and summary["max_abs_diff"] == 0.0 and summary["k3_kl"] == 0.0
    assert all(r["first_divergent_position"] is None for r in report["rollouts"])
    frameworks = report["frameworks"]
    assert frameworks["verl"]["training/rollout_probs_diff_max"] == 0.0
    assert frameworks["slime"]["train/train_rollout_logprob_abs_diff"] == 0.0
    assert frameworks["prime-rl"]["mismatch_kl/mean"] == 0.0
    assert frameworks["nemo-rl"]["train/gen_kl_error"] == 0.0
    assert frameworks["trl"]["sampling/sampling_logp_difference/max"] == 0.0
    assert frameworks["trl"]["sampling/importance_sampling_ratio/min"] == 1.0
    assert report["truncation"]["mis"]["tokens_masked"] == 0
    html = (tmp_path / "out" / "report.html").read_text()
    assert "bit for bit" in html and "<svg" in html
    assert "<script" not in html and "https://" not in html  # offline: nothing fetched


def test_a_nudged_claim_and_bad_lines(engine, own, tmp_path, capsys):
    good, nudged = own[0], dict(own[1])
    nudged["logprobs"] = list(nudged["logprobs"])
    nudged["logprobs"][3] -= 0.25
    vocab = engine.tokenizer.vocab_size
    lines = [
        json.dumps(good),
        "{not json",
        json.dumps({**good, "logprobs": good["logprobs"][:-1]}),
        json.dumps({**good, "completion_token_ids": [vocab] + good["completion_token_ids"][1:]}),
        json.dumps(nudged),
    ]
    report = _run(engine, tmp_path, lines)
    bad = {b["where"]: b for b in report["bad_records"]}
    assert sorted(bad) == ["line 2", "line 3", "line 4"]
    assert bad["line 2"]["field"] == "line" and "not JSON" in bad["line 2"]["error"]
    assert bad["line 3"]["field"] == "logprobs" and "values for" in bad["line 3"]["error"]
    assert bad["line 4"]["field"] == "completion_token_ids" and str(vocab) in bad["line 4"]["error"]
    stderr = capsys.readouterr().err
    assert all(f"line {n}" in stderr for n in (2, 3, 4))
    first, second = report["rollouts"]
    assert first["where"] == "line 1" and first["first_divergent_position"] is None
    assert second["where"] == "line 5" and second["first_divergent_position"] == 3
    assert second["num_exact"] == second["num_tokens"] - 1
    assert math.isclose(second["max_abs_diff"], 0.25, rel_tol=1e-6)
    # The claim is lower than ours: r = exp(ours - claimed) = e^0.25 at that token, 1 elsewhere.
    ratio_max = report["frameworks"]["trl"]["sampling/importance_sampling_ratio/max"]
    assert math.isclose(ratio_max, math.exp(0.25), rel_tol=1e-6)
    assert report["frameworks"]["prime-rl"]["mismatch_kl/mean"] > 0
