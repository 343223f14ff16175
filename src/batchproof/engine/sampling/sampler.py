"""Choosing the next token: penalties, bans and sampling, as pure functions of one row.

A sampled choice is made by a `SampleRow` chosen once at load: our kernels' (sample.c: the
distribution and the draw in one fixed order, the same bits on every host), or, without them,
`torch_sample`, the same rules in torch's arithmetic. The draw's number comes from the
sequence's own counter-based stream (draws.py), never a library's generator."""

from collections import Counter
from collections.abc import Callable

import torch

from batchproof.engine.sampling.draws import Draws
from batchproof.engine.sampling.params import SamplingParams

NEG_INF = float("-inf")


class SamplingError(RuntimeError):
    """Nothing can be chosen: every logit is NaN or banned."""


def logit_bias_row(logit_bias: dict[int, float], vocab_size: int) -> torch.Tensor | None:
    """A request's logit_bias as one dense row [V], built once per sequence (not per step): each
    biased id's bias, rounded to float32 as torch rounds a Python scalar, and -0.0 elsewhere.
    x + (-0.0) is x for every float (+0.0, -0.0, infinities and NaN included), so adding the
    row changes exactly the biased logits, each by one rounded addition, at the cost of one
    vector add however many entries there are. (A bfloat16 row's NaN may come back with
    another payload: still NaN, which is never chosen and fails a record.)"""
    if not logit_bias:
        return None
    row = torch.full((vocab_size,), -0.0)
    row[torch.tensor(list(logit_bias), dtype=torch.int64)] = torch.tensor(list(logit_bias.values()),
                                                                          dtype=torch.float32)
    return row


def apply_penalties(logits: torch.Tensor, params: SamplingParams, seen_ids: set[int],
                    output_counts: Counter[int], bias: torch.Tensor | None = None) -> torch.Tensor:
    """logits: [V] -> the logits the choice and the record read (a new tensor if changed).

    Repetition (over prompt and output, as vLLM and transformers do), presence and
    frequency (over the output, as OpenAI does), then logit_bias (`bias`: its row, as
    logit_bias_row(params.logit_bias, V) makes it; the engine builds it once per sequence).
    """
    if not params.has_penalties:
        return logits
    logits = logits.clone()
    if params.repetition_penalty != 1.0 and seen_ids:
        ids = torch.tensor(sorted(seen_ids), dtype=torch.int64, device=logits.device)
        picked = logits[ids]
        logits[ids] = torch.where(picked > 0, picked / params.repetition_penalty, picked * params.repetition_penalty)
    if (params.presence_penalty or params.frequency_penalty) and output_counts:
        ids = torch.tensor(list(output_counts), dtype=torch.int64, device=logits.device)
        counts = torch.tensor(list(output_counts.values()), dtype=logits.dtype, device=logits.device)
        logits[ids] -= params.presence_penalty + params.frequency_penalty * counts
    if bias is None:
        bias = logit_bias_row(params.logit_bias, logits.shape[-1])
    if bias is not None:
        # One vector add: a full-vocabulary bias looped in Python stalled every other request
        # for minutes. The bias is rounded to the row's dtype and added in float32, as
        # `logits[i] += b` rounds it: the bits of adding the entries one by one.
        logits = (logits.float() + bias.to(logits.device, logits.dtype).float()).to(logits.dtype)
    return logits


def _usable(logits: torch.Tensor, banned_ids: frozenset[int]) -> torch.Tensor:
    usable = torch.where(logits.isnan(), NEG_INF, logits)
    if banned_ids:
        usable[torch.tensor(sorted(banned_ids), dtype=torch.int64, device=logits.device)] = NEG_INF
    return usable


# (usable row [V] float32: NaN and bans already -inf, its maximum finite; the params; the
# draw u in [0, 1); whether to return the processed row) -> (chosen id, processed row or None).
SampleRow = Callable[[torch.Tensor, SamplingParams, float, bool], tuple[int, torch.Tensor | None]]


def choose_token(logits: torch.Tensor, params: SamplingParams, banned_ids: frozenset[int], draws: Draws | None,
                 sample: SampleRow) -> int:
    """logits: [V] after penalties -> the chosen id. Never picks NaN or a banned id."""
    return choose_and_process(logits, params, banned_ids, draws, sample, False)[0]


def choose_and_process(logits: torch.Tensor, params: SamplingParams, banned_ids: frozenset[int],
                       draws: Draws | None, sample: SampleRow,
                       want_processed: bool) -> tuple[int, torch.Tensor | None]:
    """choose_token's id, and (when asked) processed_logits' row from the same pass: one sampler
    call where a record in processed mode would otherwise run the sampler again over the row (a
    262k-wide sort for top-p). The same bits as the two calls: the sampler's processed row does
    not depend on the draw."""
    usable = _usable(logits, banned_ids)
    best = usable.max()
    if best == NEG_INF:
        raise SamplingError("no token can be chosen: every logit is NaN, -inf or banned")
    if params.is_greedy or best == float("inf"):
        # The first maximum: ties (and +inf, which takes all the mass) to the lower id.
        return int(usable.argmax()), usable if want_processed else None
    return sample(usable, params, draws.next(), want_processed)


def processed_logits(logits: torch.Tensor, params: SamplingParams, banned_ids: frozenset[int],
                     sample: SampleRow) -> torch.Tensor:
    """logits: [V] after penalties -> [V] whose softmax is the distribution the choice was made
    from: the bans, then (when sampling) temperature, top-k, top-p and min-p; a dropped token is
    -inf, a kept one its scaled logit (x - max) / temperature. Greedy requests keep their
    logits, as vLLM's processed logprobs do: a point mass would say nothing."""
    usable = _usable(logits, banned_ids)
    if params.is_greedy or usable.max() in (NEG_INF, float("inf")):
        return usable
    return sample(usable, params, 0.0, True)[1]  # the draw's number changes nothing here


def first_max(logits: torch.Tensor) -> torch.Tensor:
    """[B, V] -> [B] int64: each row's first maximum (the lowest id among ties), NaN never;
    -1 where nothing beats -inf. The kernels' first_max computes the same in one pass."""
    usable = torch.where(logits.isnan(), NEG_INF, logits)
    best, choice = usable.max(dim=-1)  # ties: the first (lowest) id
    return torch.where(best == NEG_INF, -1, choice)


FirstMax = Callable[[torch.Tensor], torch.Tensor]


def greedy_tokens(logits: torch.Tensor, banned: list[frozenset[int]],
                  backend: FirstMax = first_max) -> list[int | None]:
    """[B, V] -> each row's first maximum among its allowed ids, as choose_token picks it
    greedily; None for a row with nothing to choose. One pass for the whole batch
    (`backend`: first_max above, or the engine's ops' kernel).

    Banned ids (the end of turn under min_tokens or ignore_eos) are masked only in a row whose
    first maximum is one of them: elsewhere that maximum is also the first among the allowed
    ids, so the pick is the same, and no [B, V] copy is made (1 MB a row at a 262k vocabulary)."""
    picks = backend(logits).tolist()
    for row, ids in enumerate(banned):
        if ids and picks[row] in ids:
            masked = logits[row:row + 1].clone()
            masked[0, torch.tensor(sorted(ids), dtype=torch.int64, device=logits.device)] = NEG_INF
            picks[row] = backend(masked).item()
    return [None if i < 0 else i for i in picks]


def torch_sample(usable: torch.Tensor, params: SamplingParams, u: float,
                 want_processed: bool) -> tuple[int, torch.Tensor | None]:
    """A SampleRow in torch's arithmetic, where our kernels are not built: sample.c's rules
    (read them there), with torch's exp and sums, so its bits are this host's torch's."""
    # The max goes first: a huge logit divided by a small temperature must not overflow.
    scaled = (usable - usable.max()) / params.temperature
    if 0 < params.top_k < scaled.shape[-1]:
        kth = scaled.topk(params.top_k).values[-1]
        scaled = torch.where(scaled < kth, NEG_INF, scaled)
    weights = torch.where(scaled == NEG_INF, 0.0, scaled.exp())
    if params.top_p < 1.0:
        order = torch.argsort(-weights, stable=True)  # best first, ties to the lower id
        ordered = weights[order].double()
        before = ordered.cumsum(0) - ordered
        drop = order[1:][before[1:] >= params.top_p * float(weights.double().sum())]  # the best always stays
        weights = weights.index_fill(0, drop, 0.0)
    if params.min_p > 0.0:
        weights = torch.where(weights.double() < params.min_p, 0.0, weights)
    running = weights.double().cumsum(0)
    kept = torch.nonzero(weights).flatten()
    # The first id whose running sum passes the target is a kept one (a dropped id adds nothing);
    # past the end (a rounding of u * total up to the total), the last kept.
    chosen = min(int(torch.searchsorted(running, u * float(running[-1]), right=True)), int(kept[-1]))
    processed = torch.where(weights > 0.0, scaled, NEG_INF) if want_processed else None
    return chosen, processed


def banned_for_step(params: SamplingParams, end_ids: frozenset[int], num_generated: int) -> frozenset[int]:
    """End-of-turn ids may not be chosen under ignore_eos or before min_tokens."""
    if params.ignore_eos or num_generated < params.min_tokens:
        return end_ids
    return frozenset()
