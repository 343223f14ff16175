"""top_k_logprobs, log_normalizer and build_records against a brute-force reference."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batchproof.engine.sampling.logprobs import build_records, chosen_logprobs, log_normalizer, top_k_logprobs

NAN, INF = float("nan"), float("inf")

# Logits with many ties (small integers), some NaN and -inf, and ordinary float32 values.
logit_values = st.one_of(
    st.floats(-40, 40, width=32),
    st.integers(-3, 3).map(float),
    st.sampled_from([NAN, -INF]),
)


@st.composite
def logit_batches(draw: st.DrawFn) -> torch.Tensor:
    vocab = draw(st.integers(1, 40))
    batch = draw(st.integers(1, 5))
    rows = [draw(st.lists(logit_values, min_size=vocab, max_size=vocab)) for _ in range(batch)]
    return torch.tensor(rows, dtype=torch.float32)


def brute_force(row: list[float], k: int) -> tuple[list[int], list[float], list[float]]:
    """Sorted by (-logit, id) over the non-NaN logits; logprob = logit - logsumexp (float64)."""
    valid = [(v, i) for i, v in enumerate(row) if not math.isnan(v)]
    ranked = sorted(valid, key=lambda t: (-t[0], t[1]))[:k]
    top = max((v for v, _ in valid), default=-INF)
    if math.isfinite(top):
        normalizer = top + math.log(sum(math.exp(v - top) for v, _ in valid))
    else:
        normalizer = top
    return [i for _, i in ranked], [v for v, _ in ranked], [v - normalizer for v, _ in ranked]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, NaN matching NaN."""
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def close(a: float, b: float, tol: float = 1e-4) -> bool:
    if math.isinf(b) or math.isnan(b):
        return a == b or (math.isnan(a) and math.isnan(b))
    return abs(a - b) <= tol * max(1.0, abs(b))


@settings(max_examples=150, deadline=None)
@given(logits=logit_batches(), k=st.integers(0, 45))
def test_top_k_matches_brute_force(logits: torch.Tensor, k: int) -> None:
    top = top_k_logprobs(logits, k)
    assert top.ids.shape == top.logits.shape == top.logprobs.shape == (logits.shape[0], min(k, logits.shape[1]))
    for r, row in enumerate(logits.tolist()):
        ids, values, logprobs = brute_force(row, k)
        n = int(top.counts[r])
        assert n == len(ids), "k is clamped to the number of non-NaN logits"
        assert top.ids[r, :n].tolist() == ids
        assert top.logits[r, :n].tolist() == values
        got = top.logprobs[r, :n].tolist()
        assert all(close(a, b) for a, b in zip(got, logprobs)), (got, logprobs)
        assert not any(math.isnan(v) for v in top.logits[r, :n].tolist()), "NaN is never ranked"


@settings(max_examples=100, deadline=None)
@given(logits=logit_batches(), k=st.integers(0, 45))
def test_row_results_do_not_depend_on_the_other_rows(logits: torch.Tensor, k: int) -> None:
    batched = top_k_logprobs(logits, k)
    batched_norm = log_normalizer(logits)
    for r in range(logits.shape[0]):
        alone = top_k_logprobs(logits[r:r + 1], k)
        n = int(alone.counts[0])
        assert n == int(batched.counts[r])
        assert torch.equal(alone.ids[0, :n], batched.ids[r, :n])
        assert torch.equal(alone.logits[0, :n], batched.logits[r, :n])
        assert same(alone.logprobs[0, :n], batched.logprobs[r, :n])
        assert same(log_normalizer(logits[r:r + 1])[0], batched_norm[r])


def test_row_independence_at_the_real_vocabulary_size() -> None:
    """49152 logits: the chunked normaliser must give a row the same bits alone and in a batch of 16."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 49152, generator=gen) * 6
    logits[3, 100] = 1e30
    logits[5, ::7] = NAN
    batched = top_k_logprobs(logits, 20)
    for r in range(16):
        alone = top_k_logprobs(logits[r:r + 1], 20)
        assert torch.equal(alone.ids[0], batched.ids[r])
        assert torch.equal(alone.logprobs[0], batched.logprobs[r])
        # the same row in another position of another batch
        other = top_k_logprobs(torch.cat([logits[r:r + 1].flip(-1), logits[r:r + 1]]), 20)
        assert torch.equal(other.logprobs[1], batched.logprobs[r])
    ids, values, logprobs = brute_force(logits[0].tolist(), 20)
    assert batched.ids[0].tolist() == ids
    assert all(close(a, b) for a, b in zip(batched.logprobs[0].tolist(), logprobs))


def test_huge_logits_stay_finite() -> None:
    logits = torch.tensor([[1e30, 0.0, -1e30, NAN], [3e38, 3e38, -3e38, 1.0]])
    top = top_k_logprobs(logits, 4)
    assert top.counts.tolist() == [3, 4]
    assert top.ids[0, :3].tolist() == [0, 1, 2]
    assert top.ids[1].tolist() == [0, 1, 3, 2]
    assert torch.isfinite(top.logprobs[0, :3]).all() and torch.isfinite(log_normalizer(logits)).all()
    assert top.logprobs[0, 0].item() == 0.0 and top.logprobs[0, 1].item() == -torch.tensor(1e30).item()


@pytest.mark.parametrize("huge", [1e30, 3e38])
def test_tied_huge_logits_share_the_probability(huge: float) -> None:
    top = top_k_logprobs(torch.tensor([[huge, huge, 1.0]]), 3)
    assert math.isclose(top.logprobs[0, 0].item(), -math.log(2), rel_tol=1e-6)
    assert math.isclose(top.logprobs[0, 1].item(), -math.log(2), rel_tol=1e-6)


def test_all_nan_row_ranks_nothing_and_leaves_its_neighbours_alone() -> None:
    logits = torch.tensor([[NAN, NAN, NAN], [1.0, 2.0, 2.0], [NAN, NAN, NAN]])
    top = top_k_logprobs(logits, 3)
    assert top.counts.tolist() == [0, 3, 0]
    assert top.ids[1].tolist() == [1, 2, 0], "ties go to the lower id"
    records = build_records(logits, [0, 1, 0], [3, 3, 3], [0, 0, 0])
    assert records[0].top == () and records[2].top == ()
    assert [t.token_id for t in records[1].top] == [1, 2, 0]


def test_minus_inf_logits_are_ranked_last_with_minus_inf_logprob() -> None:
    logits = torch.tensor([[-INF, 0.5, NAN, -INF, 0.5]])
    top = top_k_logprobs(logits, 10)
    assert top.counts.tolist() == [4]
    assert top.ids[0, :4].tolist() == [1, 4, 0, 3]
    assert top.logprobs[0, 2].item() == -INF and top.logprobs[0, 3].item() == -INF
    assert math.isclose(top.logprobs[0, 0].item(), -math.log(2), rel_tol=1e-6)


@settings(max_examples=60, deadline=None)
@given(logits=logit_batches(), data=st.data())
def test_records_agree_with_top_k_and_chosen(logits: torch.Tensor, data: st.DataObject) -> None:
    batch, vocab = logits.shape
    token_ids = [data.draw(st.integers(0, vocab - 1)) for _ in range(batch)]
    top_ns = [data.draw(st.integers(0, 6)) for _ in range(batch)]
    records = build_records(logits, token_ids, top_ns, list(range(batch)))
    chosen = chosen_logprobs(logits, torch.tensor(token_ids))
    for r, record in enumerate(records):
        assert record.step == r and record.token_id == token_ids[r]
        ids, values, _ = brute_force(logits[r].tolist(), top_ns[r])
        assert [t.token_id for t in record.top] == ids
        assert [t.logit for t in record.top] == values
        assert same(torch.tensor(record.logprob), chosen[r])
        for entry in record.top:  # the chosen token's logprob is the same number in both places
            if entry.token_id == record.token_id:
                assert entry.logprob == record.logprob or math.isnan(entry.logprob)
        if len(record.top) >= 2:
            assert same(torch.tensor(record.top2_margin), torch.tensor(record.top[0].logit - record.top[1].logit))
        else:
            assert record.top2_margin is None


@pytest.mark.parametrize("k", [0, 1, 5])
def test_probabilities_sum_to_one(k: int) -> None:
    gen = torch.Generator().manual_seed(k)
    logits = torch.randn(3, 300, generator=gen) * 4
    full = top_k_logprobs(logits, 300)
    assert torch.allclose(full.logprobs.double().exp().sum(-1), torch.ones(3, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(full.logprobs, torch.log_softmax(logits, -1).gather(-1, full.ids), atol=1e-5)
    assert torch.equal(top_k_logprobs(logits, k).logprobs, full.logprobs[:, :k])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0.0, 1.0, 1.0, -2.5, 3.0, 1e30, float("inf"), float("-inf"),
                                          float("nan"), 7.25, -1e30]), min_size=6, max_size=6),
                min_size=1, max_size=4),
       st.integers(min_value=0, max_value=7))
def test_kernel_and_torch_routes_agree(rows, k):
    """Our one-pass kernel and the torch route: the same ids, counts and logits exactly,
    the same logprobs to float32 rounding."""
    from batchproof.engine.model.ops import KernelOps, kernels
    from batchproof.engine.sampling import logprobs

    if not kernels.available():
        pytest.skip("the kernels are not built here")
    logits = torch.tensor(rows, dtype=torch.float32)
    kernel = KernelOps(num_threads=1).normalizer_and_top_k
    norm_kernel, via_kernel = kernel(logits, k)
    norm_torch, via_torch = logprobs.normalizer_and_top_k(logits, k)
    zeros = torch.zeros(len(rows), 1, dtype=torch.int64)
    chosen_kernel, chosen_torch = norm_kernel.logprobs(zeros), norm_torch.logprobs(zeros)
    assert torch.equal(via_kernel.counts, via_torch.counts)
    for r, count in enumerate(via_kernel.counts.tolist()):
        assert via_kernel.ids[r, :count].tolist() == via_torch.ids[r, :count].tolist()
        assert torch.equal(via_kernel.logits[r, :count], via_torch.logits[r, :count])
        assert torch.allclose(via_kernel.logprobs[r, :count], via_torch.logprobs[r, :count], rtol=1e-5, atol=1e-6,
                              equal_nan=True)
    assert torch.allclose(chosen_kernel, chosen_torch, rtol=1e-5, atol=1e-6, equal_nan=True)
