"""The KV cache: one fixed region per batch slot, so a sequence's keys never move."""

import numpy as np
import torch

from batchproof.engine.memory import PAGE, copy_to_own_pages, drop_pages


def _empty(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """torch.empty, starting on a page boundary on the CPU (torch aligns to 64 bytes)."""
    if device.type != "cpu":
        return torch.empty(shape, device=device, dtype=dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = torch.empty(nbytes + PAGE, dtype=torch.uint8)
    start = -raw.data_ptr() % PAGE
    return raw[start:start + nbytes].view(dtype).view(shape)


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.max_len = max_len
        self.num_slots = num_slots
        shape = (num_layers, num_slots, num_kv_heads, max_len, head_dim)
        # Untouched pages are mapped lazily on CPU: memory grows with the sequences the slots
        # hold, not with max_len up front; page-aligned, so release() frees a slot whole.
        self.k = _empty(shape, device, dtype)
        self.v = _empty(shape, device, dtype)
        self.bytes_per_token = 2 * num_layers * num_kv_heads * head_dim * dtype.itemsize

    def release(self, slot: int) -> None:
        """A freed slot's pages go back to the OS: its sequence is done (and the prefix cache
        has copied what it keeps), and the next one writes every position before reading it.
        Else each slot would hold the pages of the longest sequence it ever served."""
        if self.k.device.type != "cpu":
            return
        for cache in (self.k, self.v):
            for layer in range(cache.shape[0]):
                region = cache[layer, slot]  # contiguous: [num_kv_heads, max_len, head_dim]
                drop_pages(region.data_ptr(), region.nbytes)

    def write_prompt(self, layer: int, slot: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [num_kv_heads, n, head_dim] for positions start..start+n-1 of one slot."""
        n = k.shape[1]
        self.k[layer, slot, :, start : start + n] = k
        self.v[layer, slot, :, start : start + n] = v

    def write_step(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor) -> None:
        """k, v: [B, num_kv_heads, head_dim], one new position per slot."""
        self.k[layer, slots, :, positions] = k
        self.v[layer, slots, :, positions] = v

    def view(self, layer: int, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[num_kv_heads, length, head_dim] keys and values of one slot."""
        return self.k[layer, slot, :, :length], self.v[layer, slot, :, :length]

    # The prefix cache's copies (it runs only with the CPU kernels, so these tensors are on
    # the CPU). Through numpy: one thread, because torch splits a copy this size over its
    # OpenMP threads, and on a busy two-core machine that made a 46 MB copy take a second.

    def write_block(self, slot: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [num_layers, num_kv_heads, n, head_dim] for positions start..start+n-1 of one slot."""
        n = k.shape[2]
        np.copyto(self.k[:, slot, :, start:start + n].numpy(), k.numpy())
        np.copyto(self.v[:, slot, :, start:start + n].numpy(), v.numpy())

    def read_block(self, slot: int, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A copy of positions start..start+n-1 of one slot, every layer: [num_layers, num_kv_heads, n, head_dim]
        (in pages of its own, which go back to the OS when the cache evicts it)."""
        return (copy_to_own_pages(self.k[:, slot, :, start:start + n]),
                copy_to_own_pages(self.v[:, slot, :, start:start + n]))
