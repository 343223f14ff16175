"""Judges a hand-made bug in each once survived the whole suite (issue 37): the cache judge's
check that the two warm alone runs agree, and the reference check naming the worst of two
prompts whose alone runs' logprobs differ."""

from batchproof.probe.judge.cache import cache_cases, cache_record, judge_case
from batchproof.probe.judge.references import AloneGroup, judge_alone
from batchproof.probe.judge.verdict import Policy
from batchproof.probe.records.entry import parse_entry
from batchproof.probe.records.reply import StreamResult

N_PREDICT = 4
POLICY = Policy(n_predict=N_PREDICT, declared_min=N_PREDICT, max_constant_run=N_PREDICT)


def reply(logprobs: list[float], cached: int | None = 0) -> StreamResult:
    """Four tokens "a" whose logprobs are `logprobs` (the same tokens, so only logprobs can differ)."""
    entries = [parse_entry({"token": "a", "logprob": lp, "bytes": [97], "top_logprobs": []}) for lp in logprobs]
    return StreamResult(entries=entries, text="a" * len(entries), completion_tokens=len(entries),
                        finish_reason="length", has_usage=True, cached_tokens=cached)


def test_two_warm_alone_runs_that_differ_are_not_blamed_on_the_cache() -> None:
    """Both warm runs hit the cache and part from the cold run, but also from each other: the
    server is not deterministic alone, so no slot's difference is the cache's."""
    case = cache_cases("Why?", lambda: "k")[0]
    cold = reply([-0.5] * 4, cached=0)
    first, second = reply([-0.25] * 4, cached=160), reply([-0.125] * 4, cached=160)
    warm = [(1, 0, first), (1, 1, second), (4, 0, first)]
    record, findings = judge_case(case, cold, reply([-0.5] * 4), warm, N_PREDICT, band_noise=lambda c: None)
    assert len(findings) == 3 and not any(f["attributable"] for f in findings)
    assert all(f["text"].endswith("(not attributable to the cache: two warm alone runs differ from each other)")
               for f in findings)
    assert [s["not_attributable"] for s in record["slots"]] == ["two warm alone runs differ from each other"] * 3
    assert cache_record([(record, findings)])["result"] != "FAIL"
    # The same slots with warm alone runs that agree: the cache is blamed for every one.
    warm = [(1, 0, first), (1, 1, first), (4, 0, first)]
    record, findings = judge_case(case, cold, reply([-0.5] * 4), warm, N_PREDICT, band_noise=lambda c: None)
    assert [f["attributable"] for f in findings] == [True] * 3
    assert cache_record([(record, findings)])["result"] == "FAIL"


def test_the_reference_names_the_worse_of_two_unstable_prompts() -> None:
    """Prompt 0's alone runs differ by 1e-06 at token 1, prompt 1's by 0.001 at token 2: the
    reason sizes and places prompt 1's (listed second, so neither the first nor the milder)."""
    mild = AloneGroup(0, [reply([-0.5] * 4), reply([-0.5, -0.500001, -0.5, -0.5])])
    worse = AloneGroup(1, [reply([-0.5] * 4), reply([-0.5, -0.5, -0.501, -0.5])])
    reference, records, stability = judge_alone([mild, worse], ["prompt 0", "prompt 1"], POLICY)
    assert reference.is_stable  # the same tokens: only the logprobs differ
    assert [r["logprobs_bitwise_equal"] for r in records] == [False, False]
    assert stability["logprobs_stable"] is False
    assert stability["logprob_max_abs_diff"] == records[1]["logprob_max_abs_diff"]
    assert stability["logprob_first_diff_at"] == 2
    assert stability["logprob_reason"] == (
        f"reference: logprobs of two alone runs differ by {records[1]['logprob_max_abs_diff']:.3g} at token 2 "
        "(prompt 1)")
    assert f"{records[1]['logprob_max_abs_diff']:.3g}" == "0.001"
