"""engine/sampling/logprobs.py's tail and named-token logprobs against float64 references: the tail is the
mass outside the shown alternatives, summed (where `1 - sum` of the shown loses it), the same
bits alone and batched; named ids give the same bits as the chosen token's logprob."""

import math

import torch

from batchproof.engine.sampling.logprobs import build_records, normalizer, normalizer_and_top_k, tail_logprobs


def _reference_tail(row: torch.Tensor, shown: list[int]) -> float:
    lp = torch.log_softmax(row.double(), -1)
    outside = torch.ones_like(lp, dtype=torch.bool)
    outside[shown] = False
    return torch.logsumexp(lp[outside], 0).item()


def test_tails_match_float64_outside_the_shown_alternatives():
    torch.manual_seed(0)
    logits = torch.randn(6, 3000) * 4
    top_ns = [0, 1, 2, 5, 20, 3]
    records = build_records(logits, [0] * 6, top_ns, list(range(6)), with_tails=[True] * 6)
    for row, record, n in zip(logits, records, top_ns):
        assert len(record.top) == n
        want = 0.0 if n == 0 else _reference_tail(row, [e.token_id for e in record.top])
        assert record.tail == want if n == 0 else math.isclose(record.tail, want, rel_tol=1e-5)


def test_a_near_certain_token_keeps_its_tail():
    """p(top) = 1 - ~1e-9: in float32, 1 - p rounds to 0 (log -inf); the summed tail keeps it."""
    logits = torch.full((1, 1000), -30.0)
    logits[0, 7] = 0.0
    norm, top = normalizer_and_top_k(logits, 1)
    one_minus = 1 - torch.exp(top.logprobs[0, 0])
    assert one_minus.item() == 0.0  # what subtracting loses
    tail = tail_logprobs(norm, top.ids, torch.tensor([1])).item()
    assert math.isclose(tail, _reference_tail(logits[0], [7]), rel_tol=1e-5)
    assert math.isclose(tail, math.log(999) - 30, rel_tol=1e-5)


def test_a_row_with_fewer_candidates_than_k_and_ties():
    """NaN rows are never ranked: the top repeats its last id past the count, which must not
    double-count; tied logits order by id."""
    logits = torch.tensor([[1.0, float("nan"), 1.0, float("nan")], [0.0, 0.0, 0.0, 0.0]])
    records = build_records(logits, [0, 1], [4, 2], [1, 1], with_tails=[True, True])
    assert [e.token_id for e in records[0].top] == [0, 2]
    assert records[0].tail == float("-inf")  # both finite tokens shown: nothing outside
    assert math.isclose(records[1].tail, math.log(0.5), rel_tol=1e-6)


def test_tails_and_named_scores_are_the_same_alone_and_batched():
    torch.manual_seed(1)
    logits = torch.randn(9, 5000) * 3
    named = [(3, 1, -1), None, (), (4999,), (0, 0), None, (17,), (2, 3), (5,)]
    batched = build_records(logits, list(range(9)), [4] * 9, list(range(9)), with_tails=[True] * 9,
                            named_ids=named)
    for r in range(9):
        alone = build_records(logits[r:r + 1], [r], [4], [r], with_tails=[True], named_ids=[named[r]])[0]
        assert alone == batched[r]


def test_named_ids_equal_the_chosen_tokens_logprob():
    """Two routes: a token named for a row, and the same token as the row's chosen one."""
    torch.manual_seed(2)
    logits = torch.randn(4, 2000)
    ids = [5, 1999, 0, 77]
    chosen = build_records(logits, ids, [0] * 4, [0] * 4)
    named = build_records(logits, [0] * 4, [0] * 4, [0] * 4, named_ids=[(t, -1) for t in ids])
    for c, n in zip(chosen, named):
        assert n.named == (c.logprob, float("-inf"))
    reference = torch.log_softmax(logits.double(), -1)
    for r, t in enumerate(ids):
        assert math.isclose(named[r].named[0], reference[r, t].item(), rel_tol=1e-5, abs_tol=1e-6)
    assert normalizer(logits).logprobs(torch.tensor(ids)[:, None]).squeeze(-1).tolist() == [c.logprob for c in chosen]
