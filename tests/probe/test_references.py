"""The m=1 references: several runs judged together, labelled per prompt and replica."""

from batchproof.probe.judge.references import combined, judge_runs
from batchproof.probe.judge.verdict import Policy, ReferenceJudgement, Sample

POLICY = Policy(n_predict=8, declared_min=4, max_constant_run=3)
WORDS = [f"w{i}" for i in range(8)]


def ok(words: list[str]) -> Sample:
    return Sample(words, len(words))


def test_every_later_run_is_compared_with_the_first() -> None:
    assert judge_runs([ok(WORDS)] * 3, POLICY) == ReferenceJudgement(True, 8, 8, None)
    least = judge_runs([ok(WORDS), ok(WORDS), ok(WORDS[:6] + ["x", "y"])], POLICY)
    assert least == ReferenceJudgement(True, 8, 6, None)
    parted = judge_runs([ok(WORDS), ok(WORDS), ok(WORDS[:2] + ["x"] * 6)], POLICY)
    assert not parted.is_stable and parted.reason.startswith("m=1 runs ref#1 and ref#3 part at token 2 < ")


def test_one_run_is_judged_only_when_refused() -> None:
    assert judge_runs([ok(WORDS)], POLICY) is None
    refused = judge_runs([Sample([], None, "HTTP 500: boom")], POLICY)
    assert refused == ReferenceJudgement(False, None, None, "ref#1: HTTP 500: boom")


def test_an_unstable_group_is_named_by_its_label() -> None:
    stable, unstable = ReferenceJudgement(True, 8, 8, None), ReferenceJudgement(False, 8, 2, "part at 2")
    assert combined([stable, unstable], ["replica a", "replica b"]).reason == "replica b: part at 2"
    assert combined([stable, unstable]).reason == "prompt 1: part at 2"
    assert combined([unstable], ["replica b"]).reason == "part at 2"
