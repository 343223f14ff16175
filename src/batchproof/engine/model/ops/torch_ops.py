"""The torch backend: the same formulas as our kernels, in torch (a GPU, or no C compiler).

Batch invariance comes from fixing the shapes: with `padded`, every decode step runs
max_batch rows, so a BLAS picks the same kernel, blocking and thread split at every step,
and prompts are prefilled one at a time. Without it, rows run as they come (faster,
not invariant).
"""

import torch
import torch.nn.functional as F

from batchproof.engine.cache.kv_cache import KVCache
from batchproof.engine.model.ops import kernels
from batchproof.engine.model.ops.base import HeadLayout, RopeTables
from batchproof.engine.model.weights import QuantWeight, RawTensor, quant_weight
from batchproof.engine.sampling import logprobs, sampler
from batchproof.engine.sampling.logprobs import Normalizer, TopK
from batchproof.engine.sampling.params import SamplingParams


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str, rope_dim: int) -> torch.Tensor:
    """x: [n, heads, head_dim]; cos, sin: [n, rope_dim / 2] at each row's position."""
    rot, rest = x[..., :rope_dim], x[..., rope_dim:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    if style == "adjacent":  # pairs (0,1), (2,3), ...
        pairs = rot.unflatten(-1, (-1, 2))
        a, b = pairs[..., 0], pairs[..., 1]
        rotated = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    else:  # pairs (i, i + rope_dim / 2)
        a, b = rot.chunk(2, dim=-1)
        rotated = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    return torch.cat((rotated, rest), dim=-1) if rest.shape[-1] else rotated


def split_heads(qkv: torch.Tensor, layout: HeadLayout) -> tuple[torch.Tensor, ...]:
    """[n, q_dim + 2 kv_dim] -> q [n, heads, hd], k and v [n, kv_heads, hd] (views)."""
    hd = layout.head_dim
    q, k, v = qkv.split((layout.num_heads * hd, layout.num_kv_heads * hd, layout.num_kv_heads * hd), dim=-1)
    return (q.unflatten(-1, (layout.num_heads, hd)), k.unflatten(-1, (layout.num_kv_heads, hd)),
            v.unflatten(-1, (layout.num_kv_heads, hd)))


def qkv_heads(qkv: torch.Tensor, layout: HeadLayout, positions: torch.Tensor, rope: RopeTables,
              q_norm: torch.Tensor | None, k_norm: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    q, k, v = split_heads(qkv, layout)
    if q_norm is not None:  # qwen3 normalises each head before RoPE
        q = rms_norm(q, q_norm, layout.norm_eps)
        k = rms_norm(k, k_norm, layout.norm_eps)
    cos, sin = rope.cos[positions], rope.sin[positions]
    q = apply_rope(q, cos, sin, layout.rope_style, layout.rope_dim)
    k = apply_rope(k, cos, sin, layout.rope_style, layout.rope_dim)
    return q, k, v


class TorchOps:
    def __init__(self, padded: bool, device: torch.device | None = None) -> None:
        self.padded = padded
        # Fixed: a BLAS may split a sum between threads, so its count is part of the bits.
        self.num_threads = torch.get_num_threads()
        self.batches_prefill = not padded  # a BLAS may block a row differently in company
        self.reuses_prefixes = False  # a BLAS blocks a row by the chunk's row count
        self.decode_path = ("torch, every step padded to max_batch rows (batch-invariant)" if padded
                            else "torch, rows as they come (not batch-invariant)")
        # A BLAS picks its blocking by the library build and the processor, so only the same
        # torch on the same kind of device promises the same bits.
        where = (torch.cuda.get_device_name(device) if device is not None and device.type == "cuda"
                 else f"cpu {torch.backends.cpu.get_cpu_capability()}")
        self.numerics = f"torch {torch.__version__} on {where}, {self.decode_path}"

    def decode_rows(self, num_seqs: int, max_batch: int) -> int:
        return max_batch if self.padded else num_seqs

    def quant_weight(self, *tensors: RawTensor) -> QuantWeight:
        return quant_weight(*tensors)  # never multiplied here: torch gets dequantized weights

    def embedding(self, table: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        return table[token_ids]

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm(x, weight, eps)

    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None,
               residual: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        y = F.linear(x, w, b)  # `out` is only a hint: a new tensor is as good here
        return y if residual is None else residual + y

    def qkv_heads(self, qkv: torch.Tensor, layout: HeadLayout, positions: torch.Tensor, rope: RopeTables,
                  q_norm: torch.Tensor | None, k_norm: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        return qkv_heads(qkv, layout, positions, rope, q_norm, k_norm)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up

    def prompt_attention(self, q: torch.Tensor, cache: KVCache, layer: int, slot: int, start: int,
                         scale: float, window: int = 0) -> torch.Tensor:
        n = q.shape[0]
        keys, values = cache.view(layer, slot, start + n)  # [kv_heads, start + n, hd]
        mask = None
        if start > 0 or window:  # a later chunk also sees every earlier position (within the window)
            key_pos = torch.arange(start + n, device=q.device)
            query_pos = torch.arange(start, start + n, device=q.device)[:, None]
            mask = key_pos[None, :] <= query_pos
            if window:
                mask &= key_pos[None, :] > query_pos - window
        attn = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], keys[None], values[None],
            attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True,
        )  # [1, heads, n, hd]
        return attn[0].transpose(0, 1)

    def decode_attention(self, q: torch.Tensor, cache: KVCache, layer: int, slots: torch.Tensor,
                         lengths: torch.Tensor, scale: float, window: int = 0) -> torch.Tensor:
        # One SDPA call per sequence over its own keys: no padding enters any row's sums.
        num_kv_heads = cache.k[layer].shape[1]
        q_groups = q.unflatten(1, (num_kv_heads, -1))  # [B, kv_heads, group, hd]
        out = torch.empty_like(q_groups)
        for row, (slot, length) in enumerate(zip(slots.tolist(), lengths.tolist())):
            keys, values = cache.view(layer, slot, length)
            if window:
                keys, values = keys[:, -window:], values[:, -window:]
            out[row] = F.scaled_dot_product_attention(q_groups[row], keys, values, scale=scale)
        return out.flatten(1, 2)

    def decode_layers(self, model, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, num_real: int,
                      cache: KVCache, routes: list[torch.Tensor] | None = None) -> torch.Tensor:
        return model.decode_layers(x, positions, slots, num_real, cache, routes)

    def normalizer_and_top_k(self, logits: torch.Tensor, k: int) -> tuple[Normalizer, TopK]:
        return logprobs.normalizer_and_top_k(logits, k)

    def tail_logprobs(self, norm: Normalizer, top_ids: torch.Tensor, num_shown: torch.Tensor) -> torch.Tensor:
        """The reference formula (logprobs.tail_logprobs): torch's exp and chunked sums."""
        return logprobs.tail_logprobs(norm, top_ids, num_shown)

    def first_max(self, logits: torch.Tensor) -> torch.Tensor:
        return sampler.first_max(logits)

    def sample(self, usable: torch.Tensor, params: SamplingParams, u: float,
               want_processed: bool) -> tuple[int, torch.Tensor | None]:
        """Our kernels' sampler where they are built (a GPU host's rows go to it on the CPU: one
        row per sampled token, and the same bits as every CPU replica's); else torch's."""
        return (kernels.sample if kernels.available() else sampler.torch_sample)(usable, params, u, want_processed)
