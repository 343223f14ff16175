"""The compiled backend: our fixed-order C kernels (float32, CPU). Every output element is
one sum over K in a fixed order on one thread, so no row's bits depend on the row count
or on the other rows; prompts can therefore share a prefill call and decode steps need
no padding."""

import torch

from batchproof.engine.cache.kv_cache import KVCache
from batchproof.engine.model.ops import kernels, torch_ops
from batchproof.engine.model.ops.base import HeadLayout, RopeTables
from batchproof.engine.model.weights import QuantWeight, RawTensor, quant_weight
from batchproof.engine.sampling.logprobs import Normalizer, TopK
from batchproof.engine.sampling.params import SamplingParams

# The architectures whose decode layer layers.c runs: pre-norm, fused QKV (bias optional),
# per-head Q/K norms (qwen3, gemma3), post-norms, SiLU or GELU-tanh, per-layer RoPE tables and
# sliding windows (gemma3); and the mixtures of experts, their routing and experts by moe.c (Q
# and K normalised whole: olmoe). A new one runs op by op until layers.c is shown to match it.
FUSED_ARCHS = frozenset({"llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "olmoe", "mixtral"})


class KernelOps:
    batches_prefill = True
    reuses_prefixes = True  # every kernel, attention included, works one row at a time

    def __init__(self, num_threads: int, is_fused: bool = True, numerics: str = "float32") -> None:
        assert numerics in ("float32", "int8")
        self.num_threads = num_threads
        # The numerics, chosen once: which matmul quantized weights run, and their layout.
        self.is_int8 = numerics == "int8"
        self._linear_q = kernels.linear_q_int8 if self.is_int8 else kernels.linear_q
        self.is_fused = is_fused  # decode steps in one C call (tests turn it off to compare)
        self._fused: kernels.DecodeLayers | None = None
        self._fused_for: tuple[object, KVCache] | None = None  # (the weights' identity, the cache) it describes
        self.decode_path = f"{kernels.kernel_name()} kernels, one fixed-order sum per output (batch-invariant)"
        # Every instruction-set path gives the same bits, so the ISA is not part of it.
        self.numerics = f"batchproof kernels {kernels.numerics_version()}" + (
            f", int8 activations {kernels.INT8_NUMERICS}" if self.is_int8 else "")

    def quant_weight(self, *tensors: RawTensor) -> QuantWeight:
        """Quantized tensors side by side, held as this numerics multiplies them: the file's blocks
        (float32), or repacked 8 rows interleaved straight from the file (int8)."""
        return kernels.int8_weight(*tensors) if self.is_int8 else quant_weight(*tensors)

    def decode_rows(self, num_seqs: int, max_batch: int) -> int:
        return num_seqs

    def embedding(self, table: torch.Tensor | QuantWeight, token_ids: torch.Tensor) -> torch.Tensor:
        if isinstance(table, QuantWeight):  # dequantize just the rows asked for
            return kernels.dequant_rows(table, token_ids)
        return table[token_ids]

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return kernels.rms_norm(x, weight, eps)

    def linear(self, x: torch.Tensor, w: torch.Tensor | QuantWeight, b: torch.Tensor | None = None,
               residual: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        # The weight's storage decides the kernel; both add the same terms in the same order.
        if isinstance(w, QuantWeight):
            return self._linear_q(x, w, b, self.num_threads, residual, out)
        return kernels.linear(x, w, b, self.num_threads, residual, out)

    def qkv_heads(self, qkv: torch.Tensor, layout: HeadLayout, positions: torch.Tensor, rope: RopeTables,
                  q_norm: torch.Tensor | None, k_norm: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        if q_norm is not None:  # qwen3 and gemma3 normalise Q/K per head before RoPE
            qkv = self._norm_qk_heads(qkv, layout, q_norm, k_norm)
        # Q's heads then K's heads open each row: rotate them all in place, in one call.
        kernels.rope_(qkv, layout.num_heads + layout.num_kv_heads, layout.head_dim, layout.rope_dim, positions,
                      rope.cos, rope.sin, layout.rope_style)
        return torch_ops.split_heads(qkv, layout)

    @staticmethod
    def _norm_qk_heads(qkv: torch.Tensor, layout: HeadLayout, q_norm: torch.Tensor,
                       k_norm: torch.Tensor) -> torch.Tensor:
        """A new [n, q_dim + 2 kv_dim] with every Q and K head normalised on its own (one row of
        the norm kernel per head), V as it was."""
        n, hd = qkv.shape[0], layout.head_dim
        q, k, v = torch_ops.split_heads(qkv, layout)
        q = kernels.rms_norm(q.reshape(-1, hd), q_norm, layout.norm_eps).view(n, -1)
        k = kernels.rms_norm(k.reshape(-1, hd), k_norm, layout.norm_eps).view(n, -1)
        return torch.cat([q, k, v.flatten(1)], dim=1)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return kernels.silu_mul(gate_up, self.num_threads)

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return kernels.gelu_tanh_mul(gate_up, self.num_threads)

    def prompt_attention(self, q: torch.Tensor, cache: KVCache, layer: int, slot: int, start: int,
                         scale: float, window: int = 0) -> torch.Tensor:
        """Each prompt row is a decode row over its own prefix: the same kernel and sums as a
        decode step at that position, so a position's bits do not depend on the chunk that
        held it (nor on whether prefill or decode computed it)."""
        return kernels.prompt_attention(q, cache.k[layer], cache.v[layer], slot, start, scale, self.num_threads,
                                        window)

    def decode_attention(self, q: torch.Tensor, cache: KVCache, layer: int, slots: torch.Tensor,
                         lengths: torch.Tensor, scale: float, window: int = 0) -> torch.Tensor:
        return kernels.decode_attention(q, cache.k[layer], cache.v[layer], slots, lengths, scale, self.num_threads,
                                        window)

    def decode_layers(self, model, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, num_real: int,
                      cache: KVCache, routes: list[torch.Tensor] | None = None) -> torch.Tensor:
        """All layers in one C call (layers.c), the same kernels in the same order as
        model.decode_layers, so the same bits; `routes` gets each MoE layer's experts [rows, k]
        appended in layer order, as model.decode_layers appends them."""
        described = self._fused_for
        # Described once per weights and cache, keyed by the objects themselves (held, so never
        # reused), not their addresses: a freed model's address can come back with the next load.
        if described is None or described[0] is not model.identity or described[1] is not cache:
            self._fused = kernels.DecodeLayers(
                model.spec, model.layers, [(rope.cos, rope.sin) for rope in model.ropes], model.windows, cache.k,
                cache.v, model.scale, self.is_int8,
            ) if model.spec.arch in FUSED_ARCHS else None
            self._fused_for = (model.identity, cache)
        if self._fused is None or not self.is_fused:
            return model.decode_layers(x, positions, slots, num_real, cache, routes)
        x = x.contiguous()
        chosen = None if routes is None else torch.empty(len(self._fused.moes), x.shape[0],
                                                          model.spec.num_experts_used, dtype=torch.int64)
        self._fused(x, positions, slots, self.num_threads, chosen)
        if routes is not None:
            routes.extend(chosen.unbind(0))
        return x

    def first_max(self, logits: torch.Tensor) -> torch.Tensor:
        return kernels.first_max(logits.float())

    def sample(self, usable: torch.Tensor, params: SamplingParams, u: float,
               want_processed: bool) -> tuple[int, torch.Tensor | None]:
        return kernels.sample(usable, params, u, want_processed)

    def normalizer_and_top_k(self, logits: torch.Tensor, k: int) -> tuple[Normalizer, TopK]:
        """Both in one pass over each row (0.17 ms a step at top 20, against 0.8 in torch)."""
        logits = logits.float()
        k = max(0, min(k, logits.shape[-1]))
        ids, values, row_max, log_total, counts = kernels.top_k_logprobs(logits, k)
        # The normaliser carries this backend's tail, so record building never sums a tail with torch's exp.
        norm = Normalizer.from_parts(logits, row_max[:, None], log_total[:, None], self.tail_logprobs)
        return norm, TopK(ids, values, norm.logprobs(ids), counts)

    def tail_logprobs(self, norm: Normalizer, top_ids: torch.Tensor, num_shown: torch.Tensor) -> torch.Tensor:
        """logprobs.c's tail: the normaliser's exp_poly terms, the shown ones zeroed, in its lanes (each
        in double) and fixed_math's log (torch's exp, sum and log differ by host and ISA; these do not)."""
        return kernels.tail_logprobs(norm.logits, norm.row_max, norm.log_total, top_ids, num_shown)
