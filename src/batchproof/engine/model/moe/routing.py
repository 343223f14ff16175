"""Which experts each token goes to, and with what weight, in arithmetic that no batch can change.

The router's logits come from the same fixed-order linear as every other matmul; the top k
and each row's log-softmax normaliser from the logprobs' own kernel (ties to the lower expert
id, one fixed-order sum per row). The probabilities are exp of those log-probabilities through
`exp_fixed`: torch's exp runs a vectorised body and a scalar tail that can differ in the last
bit, and which elements reach the tail depends on how many rows the call holds, so a token's
weights would depend on its batch. Every other step is one IEEE operation per element.
"""

import math
from dataclasses import dataclass

import torch

from batchproof.engine.model.ops import Ops

_INV_LN2 = 1.4426950408889634
# ln 2 split as fdlibm splits it: _LN2_HI has its low bits zero, so k * _LN2_HI is exact for |k| < 2**20.
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
# 1/i! for i = 10..0: on |r| <= ln2 / 2 the first term left out is below 3e-13, far under float32's 6e-8.
_TAYLOR = [1.0 / float(torch.arange(1, i + 1, dtype=torch.float64).prod()) for i in range(10, -1, -1)]


# Up to this many elements on the CPU (a decode step's few tokens times their k experts), exp_fixed
# runs on Python floats: the same operations, ~10x cheaper than ~30 torch calls on a tiny tensor.
SCALAR_AT_MOST = 64


def exp_fixed(x: torch.Tensor) -> torch.Tensor:
    """exp of a float64 tensor from multiplications, additions, a rounding and the exponent's bits
    alone: the same bits for an element wherever it sits in the tensor, on every instruction set.
    Clamped to [-700, 700] (a log-probability of -inf gives ~1e-304, 0 once in float32)."""
    if x.device.type == "cpu" and x.numel() <= SCALAR_AT_MOST:
        return torch.tensor([exp_fixed_scalar(v) for v in x.flatten().tolist()], dtype=torch.float64).view(x.shape)
    return exp_fixed_tensor(x)


def exp_fixed_scalar(v: float) -> float:
    """exp_fixed's operations on one Python float (an IEEE double: each operation rounds as
    torch's float64 one does): round() ties to even as torch.round, and ldexp is the exact
    multiplication by 2**k."""
    if v != v:
        return v
    v = min(max(v, -700.0), 700.0)
    k = round(v * _INV_LN2)
    r = (v - k * _LN2_HI) - k * _LN2_LO
    p = _TAYLOR[0]
    for c in _TAYLOR[1:]:
        p = p * r + c
    return math.ldexp(p, k)


def exp_fixed_tensor(x: torch.Tensor) -> torch.Tensor:
    x = x.clamp(-700.0, 700.0)
    k = torch.round(x * _INV_LN2)
    r = (x - k * _LN2_HI) - k * _LN2_LO  # |r| <= ln2 / 2
    p = torch.full_like(r, _TAYLOR[0])
    for c in _TAYLOR[1:]:  # Horner, one multiply and one add at a time (never fused)
        p = p * r + c
    scale = ((k.to(torch.int64) + 1023) << 52).view(torch.float64)  # 2**k, exactly
    return p * scale


@dataclass(frozen=True)
class RoutingRule:
    """How an architecture turns router logits into expert weights (chosen once, at load): every
    one here takes the softmax over all experts and keeps the best num_used; Mixtral (and a
    Qwen3-MoE or OLMoE with norm_topk_prob) rescales the kept ones to sum to 1."""

    num_used: int
    is_topk_normalised: bool


def route(ops: Ops, h: torch.Tensor, router: torch.Tensor, rule: RoutingRule) -> tuple[torch.Tensor, torch.Tensor]:
    """h [n, dim], router [experts, dim] -> (expert ids [n, k] in increasing id order, their
    weights [n, k] float32), each row's from its own arithmetic alone."""
    logits = ops.linear(h, router).float()  # [n, experts]
    _, top = ops.normalizer_and_top_k(logits, rule.num_used)  # best first, ties to the lower id
    return _weighted(top.ids, top.logprobs, rule)


def _weighted(best_ids: torch.Tensor, logprobs: torch.Tensor, rule: RoutingRule) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept experts, best first, and their log-softmax over every expert -> (ids in increasing
    order, their weights)."""
    probs = exp_fixed(logprobs.double()).float()  # [n, k]: softmax over every expert, kept k
    if rule.is_topk_normalised:
        total = probs[:, 0]
        for j in range(1, probs.shape[1]):  # summed in the best-first order, as transformers' topk has them
            total = total + probs[:, j]
        probs = probs / total[:, None]
    ids, order = best_ids.sort(dim=1)  # ids in a row are distinct: the order is unique
    return ids, probs.gather(1, order)


def route_replayed(ops: Ops, h: torch.Tensor, router: torch.Tensor, rule: RoutingRule, forced: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Routing replay (R3): forced [n, k] names the experts of each row (-1s: a free row) ->
    (the router's own choice [n, k], the ids used, their weights). A forced row's experts are
    weighted by the router's probabilities of them, as its own would be (ordered best first,
    ties to the lower id, as the top k orders them); so forcing the router's own choice, or
    none, changes no bit of a row."""
    logits = ops.linear(h, router).float()  # [n, experts]
    norm, top = ops.normalizer_and_top_k(logits, rule.num_used)
    claimed = forced.clamp(min=0).sort(dim=1).values  # increasing id: ties below go to the lower one
    logprobs = norm.logprobs(claimed)  # the same arithmetic as the top k's own logprobs
    order = torch.sort(-logprobs, dim=1, stable=True).indices  # best first
    is_forced = (forced[:, :1] >= 0).expand_as(forced)
    best_ids = torch.where(is_forced, claimed.gather(1, order), top.ids)
    ids, weights = _weighted(best_ids, torch.where(is_forced, logprobs.gather(1, order), top.logprobs), rule)
    return top.ids.sort(dim=1).values, ids, weights
