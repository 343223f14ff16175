"""The sampler against brute-force definitions: bans, NaN, greedy ties, top-k / top-p / min-p, seeds.
Every sampled case runs on both SampleRows: our kernels' (sample.c) and torch_sample."""

import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batchproof.engine.model.ops import kernels
from batchproof.engine.sampling.draws import Draws
from batchproof.engine.sampling.params import SamplingParams, SamplingParamsError
from batchproof.engine.sampling.sampler import (
    SamplingError,
    apply_penalties,
    banned_for_step,
    choose_token,
    logit_bias_row,
    torch_sample,
)

SAMPLERS = [torch_sample] + ([kernels.sample] if kernels.available() else [])
each_sampler = pytest.mark.parametrize("sample", SAMPLERS, ids=lambda f: f.__module__.rsplit(".", 1)[-1])

NAN, INF = float("nan"), float("inf")

logit_values = st.one_of(st.floats(-20, 20, width=32), st.integers(-2, 2).map(float), st.sampled_from([NAN, -INF]))


@st.composite
def rows(draw: st.DrawFn) -> tuple[torch.Tensor, frozenset[int]]:
    vocab = draw(st.integers(1, 30))
    logits = torch.tensor(draw(st.lists(logit_values, min_size=vocab, max_size=vocab)), dtype=torch.float32)
    banned = frozenset(draw(st.sets(st.integers(0, vocab - 1), max_size=vocab)))
    return logits, banned


sampling_params = st.builds(
    SamplingParams,
    temperature=st.one_of(st.just(0.0), st.floats(0.05, 2.0)),
    top_k=st.integers(0, 8),
    top_p=st.floats(0.05, 1.0),
    min_p=st.one_of(st.just(0.0), st.floats(0.0, 1.0)),
)


def usable(logits: torch.Tensor, banned: frozenset[int]) -> list[float]:
    return [-INF if (math.isnan(v) or i in banned) else v for i, v in enumerate(logits.tolist())]


def allowed_ids(values: list[float], params: SamplingParams, slack: float = 1e-5) -> set[int]:
    """Brute force, in float64: top-k (ties at the k-th value kept), then top-p, then min-p."""
    if params.is_greedy:
        best = max(values)
        return {values.index(best)}
    scaled = [v / params.temperature for v in values]
    if 0 < params.top_k < len(scaled):
        kth = sorted(scaled, reverse=True)[params.top_k - 1]
        scaled = [v if v >= kth else -INF for v in scaled]
    top = max(scaled)
    weights = [math.exp(v - top) for v in scaled]
    total = sum(weights)
    probs = [w / total for w in weights]
    order = sorted(range(len(probs)), key=lambda i: (-probs[i], i))
    mass_before, keep = 0.0, set()
    for i in order:
        if probs[i] > 0 and (params.top_p >= 1.0 or mass_before < params.top_p + slack):
            keep.add(i)
        mass_before += probs[i]
    best = max(probs)
    return {i for i in keep if probs[i] >= params.min_p * best - slack}


@each_sampler
@settings(max_examples=200, deadline=None)
@given(row=rows(), params=sampling_params, seed=st.integers(0, 2**32))
def test_choice_is_never_nan_or_banned_and_stays_in_the_allowed_set(row, params: SamplingParams, seed: int,
                                                                     sample) -> None:
    logits, banned = row
    values = usable(logits, banned)
    draws = Draws(seed)
    if all(v == -INF for v in values):
        with pytest.raises(SamplingError):
            choose_token(logits, params, banned, draws, sample)
        return
    chosen = choose_token(logits, params, banned, draws, sample)
    assert chosen not in banned
    assert not math.isnan(logits[chosen].item())
    assert values[chosen] > -INF, "a token with probability 0 was drawn"
    assert chosen in allowed_ids(values, params)


@settings(max_examples=100, deadline=None)
@given(row=rows())
def test_greedy_picks_the_first_maximum(row) -> None:
    logits, banned = row
    values = usable(logits, banned)
    best = max(values)
    if best == -INF:
        return
    assert choose_token(logits, SamplingParams(temperature=0.0), banned, None, torch_sample) == values.index(best)


@each_sampler
@settings(max_examples=60, deadline=None)
@given(row=rows(), params=sampling_params, seed=st.integers(0, 2**32))
def test_a_seeded_generator_reproduces_its_draws(row, params: SamplingParams, seed: int, sample) -> None:
    logits, banned = row
    if all(v == -INF for v in usable(logits, banned)):
        return

    def draws() -> list[int]:
        draws = Draws(seed)
        return [choose_token(logits, params, banned, draws, sample) for _ in range(8)]

    assert draws() == draws()


@each_sampler
def test_sampling_follows_the_tempered_softmax(sample) -> None:
    """4000 draws at temperature 0.5 against softmax(logits / 0.5): within 5 standard errors."""
    logits = torch.tensor([0.0, 1.0, 2.0, -1.0])
    params = SamplingParams(temperature=0.5)
    draws = Draws(1234)
    n = 4000
    counts = Counter(choose_token(logits, params, frozenset(), draws, sample) for _ in range(n))
    probs = torch.softmax(logits.double() / 0.5, -1).tolist()
    for i, p in enumerate(probs):
        assert abs(counts[i] / n - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-3, (counts, probs)


@each_sampler
def test_min_p_and_top_k_cut_exactly_where_defined(sample) -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    draws = Draws(0)
    seen = {choose_token(logits, SamplingParams(temperature=1.0, min_p=0.35), frozenset(), draws, sample)
            for _ in range(300)}
    assert seen == {0, 1}, "min_p 0.35 keeps p >= 0.175"
    seen = {choose_token(logits, SamplingParams(temperature=1.0, top_k=3), frozenset(), draws, sample)
            for _ in range(500)}
    assert seen == {0, 1, 2}
    seen = {choose_token(logits, SamplingParams(temperature=1.0, top_p=0.8), frozenset(), draws, sample)
            for _ in range(300)}
    assert seen == {0, 1}, "top_p 0.8: 0.5 + 0.3 already reach it"


@pytest.mark.parametrize("logits,temperature", [([1.0, INF, 2.0], 1.0), ([3e38, 1.0], 0.5)])
@each_sampler
def test_sampling_with_an_infinite_logit_picks_it(logits: list[float], temperature: float, sample) -> None:
    draws = Draws(0)
    assert choose_token(torch.tensor(logits), SamplingParams(temperature=temperature), frozenset(), draws, sample) == \
        choose_token(torch.tensor(logits), SamplingParams(temperature=0.0), frozenset(), None, torch_sample)


# --- penalties: the vectorised code against a per-token loop ------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.floats(-10, 10, width=32), min_size=2, max_size=20),
    data=st.data(),
    repetition=st.sampled_from([1.0, 0.7, 1.3]),
    presence=st.sampled_from([0.0, 0.5, -1.0]),
    frequency=st.sampled_from([0.0, 0.25, 2.0]),
)
def test_penalties_match_a_per_token_loop(values, data, repetition, presence, frequency) -> None:
    vocab = len(values)
    ids = st.integers(0, vocab - 1)
    seen = set(data.draw(st.lists(ids, max_size=6)))
    output = data.draw(st.lists(ids, max_size=6))
    bias = data.draw(st.dictionaries(ids, st.sampled_from([-100.0, -1.5, 3.0, 100.0]), max_size=3))
    params = SamplingParams(repetition_penalty=repetition, presence_penalty=presence, frequency_penalty=frequency,
                            logit_bias=bias)
    seen |= set(output)
    logits = torch.tensor(values, dtype=torch.float32)
    before = logits.clone()
    got = apply_penalties(logits, params, seen, Counter(output))
    assert torch.equal(logits, before), "the caller's logits are not modified"
    counts = Counter(output)
    expected = []
    for i, v in enumerate(values):
        x = torch.tensor(v, dtype=torch.float32)
        if repetition != 1.0 and i in seen:
            x = x / repetition if x > 0 else x * repetition
        if counts[i]:
            x = x - (presence + frequency * counts[i])
        x = x + bias.get(i, 0.0)
        expected.append(x.item())
    assert torch.allclose(got, torch.tensor(expected), atol=1e-5)


def test_no_penalties_means_the_same_tensor() -> None:
    logits = torch.randn(10)
    assert apply_penalties(logits, SamplingParams(), {1, 2}, Counter([1])) is logits


def test_end_of_turn_is_banned_under_ignore_eos_and_before_min_tokens() -> None:
    end = frozenset({0, 2})
    assert banned_for_step(SamplingParams(ignore_eos=True), end, 100) == end
    assert banned_for_step(SamplingParams(min_tokens=3, max_tokens=5), end, 2) == end
    assert banned_for_step(SamplingParams(min_tokens=3, max_tokens=5), end, 3) == frozenset()
    assert banned_for_step(SamplingParams(), end, 0) == frozenset()


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.1), ("temperature", 2.5), ("top_k", -1), ("top_p", 0.0), ("top_p", 1.5),
    ("min_p", 1.5), ("repetition_penalty", 0.0), ("presence_penalty", 2.5), ("frequency_penalty", -3.0),
    ("max_tokens", -1), ("top_logprobs", -1), ("prompt_logprobs", -2), ("stop", ("",)),
    ("logit_bias", {5: 101.0}),
])
def test_bad_sampling_params_name_the_field(field: str, value) -> None:
    with pytest.raises(SamplingParamsError) as caught:
        SamplingParams(**{field: value})
    assert caught.value.param == field
    assert field in str(caught.value)


def test_min_tokens_above_max_tokens_is_refused() -> None:
    with pytest.raises(SamplingParamsError) as caught:
        SamplingParams(min_tokens=5, max_tokens=3)
    assert caught.value.param == "min_tokens"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0.0, 1.0, 1.0, -3.0, 5.0, float("nan"), float("-inf"), float("inf")]),
                         min_size=5, max_size=5), min_size=1, max_size=4),
       st.lists(st.frozensets(st.integers(min_value=0, max_value=4), max_size=3), min_size=4, max_size=4))
def test_batched_greedy_equals_one_row_at_a_time(rows, bans):
    """The engine's one-pass greedy choice and choose_token agree, bans included."""
    from batchproof.engine.model.ops import kernels
    from batchproof.engine.sampling.sampler import greedy_tokens

    logits = torch.tensor(rows, dtype=torch.float32)
    bans = bans[:len(rows)]
    batched = greedy_tokens(logits, bans)
    for row, banned, picked in zip(logits, bans, batched):
        try:
            expected = choose_token(row, SamplingParams(temperature=0.0), banned, None, torch_sample)
        except SamplingError:
            expected = None
        assert picked == expected
    if kernels.available():  # the kernels' one-pass choice is the same
        assert greedy_tokens(logits, bans, kernels.first_max) == batched


@each_sampler
def test_processed_logits_are_the_distribution_sampled_from(sample) -> None:
    """softmax(processed_logits) is what a draw is made from: the bans, temperature, top-k, top-p
    and min-p applied (as allowed_ids defines them), the dropped tokens at -inf, the kept ones
    their tempered logits; every draw lands on a kept token."""
    from batchproof.engine.sampling.sampler import processed_logits

    logits = torch.linspace(-3.0, 4.0, 50)
    params = SamplingParams(temperature=0.7, top_k=10, top_p=0.9, min_p=0.05)
    banned = frozenset({49})
    processed = processed_logits(logits, params, banned, sample)
    kept = {i for i, v in enumerate(processed.tolist()) if v > -INF}
    assert kept == allowed_ids(usable(logits, banned), params) and 49 not in kept and len(kept) <= 10
    tempered = torch.tensor([v / 0.7 if i in kept else -INF for i, v in enumerate(logits.tolist())],
                            dtype=torch.float64)
    assert torch.allclose(torch.softmax(processed.double(), -1), torch.softmax(tempered, -1), atol=1e-6)
    draws = Draws(7)
    assert {choose_token(logits, params, banned, draws, sample) for _ in range(300)} <= kept
    greedy = SamplingParams(temperature=0.0)
    assert torch.equal(processed_logits(logits, greedy, frozenset(), sample), logits)  # greedy: the logits, as vLLM


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       num_entries=st.sampled_from([1, 7, 300, 4096]))
def test_logit_bias_in_one_tensor_operation_is_bitwise_the_entries_added_one_by_one(seed, dtype, num_entries) -> None:
    """The bias is applied as one vector add (a full-vocabulary bias looped in Python once
    stalled every request for minutes): each logit gets the same rounding as `logits[i] += b`,
    and the others (signed zeros, infinities and NaN among them) keep their bits."""
    generator = torch.Generator().manual_seed(seed)
    vocab = 4096
    logits = (torch.randn(vocab, generator=generator) * 30).to(dtype)
    logits[:4] = torch.tensor([-0.0, float("inf"), float("-inf"), float("nan")], dtype=dtype)
    ids = (torch.randperm(vocab - 4, generator=generator)[:num_entries] + 4).tolist()
    values = ((torch.rand(num_entries, generator=generator, dtype=torch.float64) - 0.5) * 200).tolist()
    bias = dict(zip(ids, values))
    expected = logits.clone()
    for token_id, value in bias.items():
        expected[token_id] += value
    got = apply_penalties(logits, SamplingParams(logit_bias=bias), set(), Counter())
    prebuilt = apply_penalties(logits, SamplingParams(logit_bias=bias), set(), Counter(), logit_bias_row(bias, vocab))
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    for result in (got, prebuilt):
        # A NaN stays NaN (a bfloat16 round trip may change its payload, which nothing reads).
        assert torch.equal(result.isnan(), expected.isnan())
        assert torch.equal(result[~result.isnan()].view(bits), expected[~expected.isnan()].view(bits))
