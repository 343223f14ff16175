"""A routing receipt: the experts each fed position was routed to, [positions, MoE layers, k],
in the smallest unsigned type that holds every expert id (as vLLM returns them: docs/moe.md)."""

import numpy as np
import torch


def by_position(routes: list[torch.Tensor]) -> torch.Tensor:
    """Each MoE layer's ids [n, k], in layer order (what a forward pass appended) -> [n, layers, k]."""
    return torch.stack(routes, dim=1)


def id_dtype(num_experts: int) -> np.dtype:
    """uint8 up to 256 experts, uint16 up to 65,536, else int32: vLLM's choice, so a trainer's
    reader of its receipts reads ours."""
    if num_experts <= 2**8:
        return np.dtype(np.uint8)
    return np.dtype(np.uint16) if num_experts <= 2**16 else np.dtype(np.int32)


def receipt(chunks: list[torch.Tensor], num_positions: int, num_experts: int) -> np.ndarray | None:
    """A sequence's route chunks (sequence.routes) -> its first num_positions rows [n, layers, k];
    None when nothing was fed (aborted while it waited: vLLM's None too)."""
    if not chunks:
        return None
    return torch.cat(chunks)[:num_positions].numpy().astype(id_dtype(num_experts))


def replay_error(forced: np.ndarray, num_experts: int, num_moe_layers: int, num_used: int,
                 num_positions: int) -> str | None:
    """Why a routing to replay (SamplingParams.forced_routes) cannot be this model's, or None: its
    shape [at most num_positions, MoE layers, k], ids in range and distinct in each row."""
    if forced.ndim != 3 or forced.shape[1:] != (num_moe_layers, num_used) or len(forced) > num_positions:
        return (f"a routing to replay is [at most {num_positions} positions, {num_moe_layers} MoE layers, "
                f"{num_used} experts] here, got {list(forced.shape)}")
    if forced.size and (forced.min() < 0 or forced.max() >= num_experts):
        return f"expert ids are in 0..{num_experts - 1} here, got {int(forced.min())}..{int(forced.max())}"
    if num_used > 1 and (np.diff(np.sort(forced, axis=2), axis=2) == 0).any():
        return "a position's experts in one layer are distinct"
    return None
