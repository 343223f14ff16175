"""What the forward pass and the logprobs run on: one `Ops` object, chosen once at load.

Two implementations sit side by side: `KernelOps` (our compiled fixed-order kernels,
float32 on CPU) and `TorchOps` (torch, padded to a fixed row count when invariance is
asked for). The model never asks which one it has.
"""

from dataclasses import dataclass
from typing import Protocol

import torch

from batchproof.engine.cache.kv_cache import KVCache
from batchproof.engine.sampling.logprobs import Normalizer, TopK
from batchproof.engine.sampling.params import SamplingParams


@dataclass(frozen=True)
class HeadLayout:
    """How a fused QKV row splits into heads, and how RoPE turns them."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_dim: int
    rope_style: str  # "adjacent" pairs (0,1), (2,3)...; else pairs (i, i + rope_dim / 2)
    norm_eps: float


@dataclass(frozen=True)
class RopeTables:
    cos: torch.Tensor  # [max_len, rope_dim / 2]
    sin: torch.Tensor


class Ops(Protocol):
    decode_path: str  # in words, for /v1/server_info
    # What determines the bits besides the model, weights mode and dtype: two servers whose
    # numerics match must answer identically (hashed into /v1/server_info's numerics_id).
    numerics: str
    batches_prefill: bool  # several prompts may share a prefill call without changing a bit
    num_threads: int  # CPU threads a call may use; the engine sets it each step (engine/model/ops/threads.py)
    # A position's keys, values and hidden state are the same bits however the prompt was
    # cut into chunks and whichever path (prefill or decode) computed them, so they may be
    # stored and reused by another request (the prefix cache).
    reuses_prefixes: bool

    def decode_rows(self, num_seqs: int, max_batch: int) -> int:
        """How many rows a decode step of num_seqs sequences runs (the rest is padding)."""

    def quant_weight(self, *tensors):
        """Quantized tensors (RawTensor) side by side as one QuantWeight, held in the layout this
        backend's linear multiplies and its embedding lookup reads; built once, at load."""

    def embedding(self, table, token_ids: torch.Tensor) -> torch.Tensor:
        """Rows token_ids of the embedding table (float or in GGUF blocks) -> [n, dim] float."""

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor: ...

    def linear(self, x: torch.Tensor, w, b: torch.Tensor | None = None,
               residual: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """x @ w^T (+ b), plus `residual` when given (which may be updated in place); w is a
        float tensor, or (KernelOps) a QuantWeight multiplied straight from its blocks. `out`,
        a buffer of the result's shape that the result may be written into (or not)."""

    def qkv_heads(self, qkv: torch.Tensor, layout: HeadLayout, positions: torch.Tensor, rope: RopeTables,
                  q_norm: torch.Tensor | None, k_norm: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """qkv [n, q_dim + 2 kv_dim] -> q [n, heads, hd], k and v [n, kv_heads, hd], q/k
        normalised per head when the model has the norms (qwen3, gemma3), RoPE applied."""

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[rows, 2 * ffn] ([gate | up]) -> silu(gate) * up."""

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[rows, 2 * ffn] ([gate | up]) -> gelu_tanh(gate) * up (gemma3)."""

    def prompt_attention(self, q: torch.Tensor, cache: KVCache, layer: int, slot: int, start: int,
                         scale: float, window: int = 0) -> torch.Tensor:
        """q [n, heads, hd] at positions start.. of one slot, whose keys are already in the
        cache; causal, and with a window W > 0 the row at position p sees keys
        max(0, p - W + 1)..p -> [n, heads, hd]."""

    def decode_attention(self, q: torch.Tensor, cache: KVCache, layer: int, slots: torch.Tensor,
                         lengths: torch.Tensor, scale: float, window: int = 0) -> torch.Tensor:
        """q [B, heads, hd], one query per sequence over its own cached keys (its last
        `window` ones when window > 0) -> [B, heads, hd]."""

    def decode_layers(self, model, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, num_real: int,
                      cache: KVCache, routes: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Every layer of a decode step over the residual stream x [rows, dim]: the model's
        own op-by-op loop (model.decode_layers), or the same ops fused into one call; `routes`, when
        a request in the step asked for its routing: each MoE layer's experts [rows, k] appended."""

    def normalizer_and_top_k(self, logits: torch.Tensor, k: int) -> tuple[Normalizer, TopK]:
        """Each row's log-softmax normaliser and its best k, each row on its own fixed-order sums."""

    def tail_logprobs(self, norm: Normalizer, top_ids: torch.Tensor, num_shown: torch.Tensor) -> torch.Tensor:
        """[B]: each row's logprob outside its first num_shown[r] top ids, the normaliser's terms
        summed in its order (0 exactly when none is shown, -inf when they hold all the mass)."""

    def first_max(self, logits: torch.Tensor) -> torch.Tensor:
        """[B, V] -> [B]: each row's first maximum (lowest id among ties), NaN never; -1 if
        nothing beats -inf. The greedy choice."""

    def sample(self, usable: torch.Tensor, params: SamplingParams, u: float,
               want_processed: bool) -> tuple[int, torch.Tensor | None]:
        """A sampled choice and the distribution it drew from (sampler.SampleRow)."""
