"""An MoE layer's MLP: each token's chosen experts run on it, and their outputs are summed in
increasing expert id, each weighted by the router (routing.py).

Rows routed to one expert are gathered into one matmul (an expert's weights are read once per
step, not once per token), which changes no bit: every linear here computes each output as one
fixed-order sum over its own row (ops/kernel_ops.py), whatever the row count or the other rows.
The weighted sum is then formed slot by slot in expert id order, as transformers' index_add_
over its experts in increasing id forms it, so a token's result is the same alone, in any
batch, in any prefill chunk.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from batchproof.engine.model.moe.routing import RoutingRule, route, route_replayed
from batchproof.engine.model.ops import Ops
from batchproof.engine.model.weights import QuantWeight

Weight = torch.Tensor | QuantWeight


@dataclass
class MoeWeights:
    router: torch.Tensor  # [experts, dim] float
    gate_up: list[Weight]  # per expert: [2 * expert_ffn, dim] ([gate | up])
    down: list[Weight]  # per expert: [dim, expert_ffn]

    def tensors(self) -> Iterator[Weight]:
        yield self.router
        yield from self.gate_up
        yield from self.down


class MoeMlp:
    """The routed MLP of one architecture (its rule and activation fixed at load)."""

    def __init__(self, ops: Ops, act: Callable[[torch.Tensor], torch.Tensor], rule: RoutingRule) -> None:
        self.ops, self.act, self.rule = ops, act, rule

    def __call__(self, h: torch.Tensor, weights: MoeWeights, routes: list[torch.Tensor] | None = None,
                 forced: torch.Tensor | None = None) -> torch.Tensor:
        """h: [n, dim] (normalised) -> the experts' weighted sum [n, dim] (the residual not added).
        `routes`, when a request in the step asked for its routing: each row's expert ids [n, k]
        appended, the router's own (computed anyway: recording them costs a reference).
        `forced` [n, k]: the experts of the rows being replayed (-1s elsewhere: routing.route_replayed)."""
        if forced is None:
            ids, expert_weights = route(self.ops, h, weights.router, self.rule)  # [n, k] each
            own = ids
        else:
            own, ids, expert_weights = route_replayed(self.ops, h, weights.router, self.rule, forced)
        if routes is not None:
            routes.append(own)
        n, k = ids.shape
        if n == 1:  # one token (op by op): no grouping to do, so none of its sorting, gathering, scattering
            return self._one_row(h, weights, ids[0].tolist(), expert_weights)
        flat = ids.flatten()  # [n * k]: token t's slot j at t * k + j
        tokens = torch.arange(n, device=h.device).repeat_interleave(k)
        order = torch.argsort(flat, stable=True)  # the (token, slot) pairs grouped by expert
        experts, counts = torch.unique_consecutive(flat[order], return_counts=True)
        outs = h.new_empty(n * k, h.shape[1])
        start = 0
        for e, count in zip(experts.tolist(), counts.tolist()):
            pairs = order[start:start + count]
            start += count
            gate_up = self.ops.linear(h[tokens[pairs]], weights.gate_up[e])  # [count, 2 * expert_ffn]
            outs[pairs] = self.ops.linear(self.act(gate_up), weights.down[e])  # [count, dim]
        outs = outs.view(n, k, -1)
        total = outs[:, 0] * expert_weights[:, :1]
        for j in range(1, k):  # slot by slot: increasing expert id in every row
            total = total + outs[:, j] * expert_weights[:, j:j + 1]
        return total

    def _one_row(self, h: torch.Tensor, weights: MoeWeights, ids: list[int],
                   expert_weights: torch.Tensor) -> torch.Tensor:
        """Each of the row's experts on it, in its slots' order, summed as the grouped path sums:
        each operation the one the grouped path applies to this row, so the same bits."""
        total = None
        for j, e in enumerate(ids):
            out = self.ops.linear(self.act(self.ops.linear(h, weights.gate_up[e])), weights.down[e])
            term = out * expert_weights[:, j:j + 1]
            total = term if total is None else total + term
        return total
