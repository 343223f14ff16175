"""The transformer forward pass: llama / qwen2 / qwen3 / gemma3 and the mixtures of experts (qwen3moe,
olmoe, mixtral: moe/), read top to bottom like the architecture."""

import dataclasses
from dataclasses import dataclass

import torch

from batchproof.engine.cache.kv_cache import KVCache
from batchproof.engine.model.moe.layer import MoeMlp, MoeWeights
from batchproof.engine.model.moe.routing import RoutingRule
from batchproof.engine.model.ops import HeadLayout, Ops, RopeTables, kernels
from batchproof.engine.model.spec import ModelFile, ModelSpec
from batchproof.engine.model.weights import QuantWeight, RawTensor, as_raw

Weight = torch.Tensor | QuantWeight  # float (torch) or kept in its GGUF blocks


@dataclass(frozen=True)
class Segment:
    """Consecutive prompt tokens of one sequence: positions start.. in the cache slot `slot`."""

    token_ids: torch.Tensor  # [n]
    start: int
    slot: int


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # [dim]
    wqkv: Weight  # [q_dim + 2 * kv_dim, dim]
    bqkv: torch.Tensor | None  # [q_dim + 2 * kv_dim] (qwen2)
    q_norm: torch.Tensor | None  # [head_dim] (qwen3, gemma3)
    k_norm: torch.Tensor | None
    wo: Weight  # [dim, q_dim]
    ffn_norm: torch.Tensor  # [dim]
    w_gate_up: Weight | None  # [2 * ffn_dim, dim] (None in an MoE layer)
    w_down: Weight | None  # [dim, ffn_dim]
    post_attn_norm: torch.Tensor | None = None  # [dim] (gemma3: on the attention output)
    post_ffn_norm: torch.Tensor | None = None  # [dim] (gemma3: on the MLP output)
    moe: MoeWeights | None = None  # the router and experts of an MoE layer (in place of w_gate_up, w_down)
    q_norm_full: torch.Tensor | None = None  # [q_dim] (olmoe: the whole Q projection normalised)
    k_norm_full: torch.Tensor | None = None  # [kv_dim]


def rope_tables(rope_dim: int, base: float, max_len: int, freq_factors: torch.Tensor | None,
                linear_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [max_len, rope_dim / 2], formed as Hugging Face forms them (float32). With our
    kernels built, by sample.c (its powers, cos and sin in fixed double arithmetic, the same bits
    on every host: torch's vectorised pow, cos and sin differ between instruction sets); else by
    torch's."""
    if kernels.available():
        return kernels.rope_tables(rope_dim, base, max_len, freq_factors, linear_factor)
    exponents = torch.arange(0, rope_dim, 2, dtype=torch.int64).float() / rope_dim
    inv_freq = 1.0 / (base**exponents)
    if freq_factors is not None:  # Llama 3.x long-context scaling, stored per frequency
        inv_freq = inv_freq / freq_factors.float()
    if linear_factor != 1.0:  # Gemma 3's global layers (4B and up): positions / factor
        inv_freq = inv_freq / linear_factor
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


class Transformer:
    def __init__(self, spec: ModelSpec, layers: list[LayerWeights], embed: Weight, final_norm: torch.Tensor,
                 lm_head: Weight, rope_freqs: torch.Tensor | None, max_len: int, ops: Ops) -> None:
        self.spec = spec
        self.ops = ops  # the arithmetic, chosen once at load (ops/__init__.py)
        # These weights' own name for what is built over them (the fused decode's description):
        # a new object per load, held by whoever keys on it, so never another model's, where
        # id(self) is an address CPython gives again once this model is freed.
        self.identity = object()
        self.layers = layers
        self.embed = embed  # [vocab, dim]
        self.final_norm = final_norm
        self.lm_head = lm_head  # [vocab, dim]; the same tensor as embed when tied
        self.device = final_norm.device
        cos, sin = rope_tables(spec.rope_dim, spec.rope_base, max_len, rope_freqs, spec.rope_linear_factor)
        self.rope = RopeTables(cos.to(self.device), sin.to(self.device))
        # Per layer: its sliding window (0: none) and its RoPE (gemma3's local layers have their own).
        self.windows = [spec.window(i) for i in range(spec.num_layers)]
        local_rope = self.rope
        if any(self.windows):
            cos, sin = rope_tables(spec.rope_dim, spec.rope_base_local, max_len, None)
            local_rope = RopeTables(cos.to(self.device), sin.to(self.device))
        self.ropes = [local_rope if w else self.rope for w in self.windows]
        self.heads = HeadLayout(spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.rope_dim, spec.rope_style,
                                spec.norm_eps)
        self.q_dim = spec.num_heads * spec.head_dim
        self.kv_dim = spec.num_kv_heads * spec.head_dim
        self.scale = spec.attn_scale
        # Hugging Face casts Gemma's sqrt(dim) to the weights' dtype before multiplying.
        self.embed_scale = (None if spec.embed_scale is None
                            else torch.tensor(spec.embed_scale, dtype=final_norm.dtype, device=self.device))
        self._act = ops.gelu_tanh_mul if spec.mlp_act == "gelu_tanh" else ops.silu_mul
        self._moe = MoeMlp(ops, self._act, RoutingRule(spec.num_experts_used, spec.is_topk_normalised))
        # Each MoE layer's place among them: its axis in a routing receipt or a replayed routing.
        self.moe_index = {i: j for j, i in enumerate(i for i in range(spec.num_layers) if spec.is_moe_layer(i))}

    @classmethod
    def from_model_file(cls, model_file: ModelFile, device: torch.device, dtype: torch.dtype, max_len: int,
                        ops: Ops) -> "Transformer":
        t = model_file.tensors

        def get(name: str) -> torch.Tensor:
            return torch.from_numpy(t[name]).to(device=device, dtype=dtype)

        def maybe(name: str) -> torch.Tensor | None:
            return get(name) if name in t else None

        def matmul(*names: str) -> Weight:
            """One weight from tensors side by side: kept quantized if the file read kept them
            (in the layout the ops multiply), else a float tensor."""
            if any(isinstance(t[n], RawTensor) for n in names):
                return ops.quant_weight(*(as_raw(t[n]) for n in names))
            return torch.cat([get(n) for n in names]) if len(names) > 1 else get(names[0])

        def experts(p: str) -> MoeWeights:
            """An MoE layer's router (float) and its experts, each gate and up fused as a dense MLP's."""
            each = [f"{p}experts.{e}." for e in range(model_file.spec.num_experts)]
            return MoeWeights(router=get(p + "router"),
                              gate_up=[matmul(e + "w_gate_exp", e + "w_up_exp") for e in each],
                              down=[matmul(e + "w_down_exp") for e in each])

        layers = []
        for i in range(model_file.spec.num_layers):
            p = f"layers.{i}."
            biases = [maybe(p + b) for b in ("bq", "bk", "bv")]
            is_moe = model_file.spec.is_moe_layer(i)
            layers.append(LayerWeights(
                attn_norm=get(p + "attn_norm"),
                wqkv=matmul(p + "wq", p + "wk", p + "wv"),
                bqkv=torch.cat(biases) if all(b is not None for b in biases) else None,
                q_norm=maybe(p + "q_norm"),
                k_norm=maybe(p + "k_norm"),
                wo=matmul(p + "wo"),
                ffn_norm=get(p + "ffn_norm"),
                w_gate_up=None if is_moe else matmul(p + "w_gate", p + "w_up"),
                w_down=None if is_moe else matmul(p + "w_down"),
                post_attn_norm=maybe(p + "post_attn_norm"),
                post_ffn_norm=maybe(p + "post_ffn_norm"),
                moe=experts(p) if is_moe else None,
                q_norm_full=maybe(p + "q_norm_full"),
                k_norm_full=maybe(p + "k_norm_full"),
            ))
            model_file.drop_resident_pages()  # this layer's weights are copied out
        # In the layout the ops multiply, which the embedding lookup also reads: a tied LM head is
        # the same object, held once.
        embed = matmul("embed")
        lm_head = matmul("lm_head") if "lm_head" in t else embed
        rope_freqs = torch.from_numpy(t["rope_freqs"]) if "rope_freqs" in t else None
        return cls(model_file.spec, layers, embed, get("final_norm"), lm_head, rope_freqs, max_len, ops)

    # --- pieces shared by prefill and decode -------------------------------------------

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, weight, self.spec.norm_eps)

    def _embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        x = self.ops.embedding(self.embed, token_ids)  # [n, dim]
        return x if self.embed_scale is None else x * self.embed_scale

    def _qkv(self, i: int, layer: LayerWeights, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """h: [n, dim] -> q [n, heads, hd], k and v [n, kv_heads, hd], RoPE applied."""
        qkv = self.ops.linear(h, layer.wqkv, layer.bqkv)  # [n, q_dim + 2 kv_dim]
        if layer.q_norm_full is not None:  # olmoe: Q and K normalised whole, before the heads
            qkv = self._norm_qk_full(layer, qkv)
        return self.ops.qkv_heads(qkv, self.heads, positions, self.ropes[i], layer.q_norm, layer.k_norm)

    def _norm_qk_full(self, layer: LayerWeights, qkv: torch.Tensor) -> torch.Tensor:
        q, k, v = qkv.split((self.q_dim, self.kv_dim, self.kv_dim), dim=1)
        q = self._norm(q.contiguous(), layer.q_norm_full)
        k = self._norm(k.contiguous(), layer.k_norm_full)
        return torch.cat([q, k, v], dim=1)

    def _add(self, x: torch.Tensor, h: torch.Tensor, w: Weight, post_norm: torch.Tensor | None) -> torch.Tensor:
        """The residual stream x plus h @ w^T, normalised first where the model has a post-norm (gemma3)."""
        if post_norm is None:
            return self.ops.linear(h, w, residual=x)
        return x + self._norm(self.ops.linear(h, w), post_norm)

    def _mlp(self, layer: LayerWeights, x: torch.Tensor, routes: list[torch.Tensor] | None = None,
             forced: torch.Tensor | None = None) -> torch.Tensor:
        """`routes`: each MoE layer's expert ids [n, k] appended, in layer order (moe/receipt.py);
        `forced`: this layer's replayed experts [n, k] (-1s: free rows)."""
        h = self._norm(x, layer.ffn_norm)
        if layer.moe is not None:  # a routed layer: its experts' weighted sum (moe/layer.py)
            return x + self._moe(h, layer.moe, routes, forced)
        gate_up = self.ops.linear(h, layer.w_gate_up)  # [n, 2 * ffn_dim]
        return self._add(x, self._act(gate_up), layer.w_down, layer.post_ffn_norm)

    @property
    def weights_nbytes(self) -> int:
        """Bytes of weights held (a tied LM head counted once)."""
        seen: dict[int, int] = {}
        held = [getattr(layer, f.name) for layer in self.layers for f in dataclasses.fields(layer)]
        held = [t for w in held for t in (w.tensors() if isinstance(w, MoeWeights) else [w])]
        for w in [self.embed, self.lm_head, self.final_norm, *held]:
            if w is not None:
                seen[id(w)] = w.nbytes if isinstance(w, QuantWeight) else w.numel() * w.element_size()
        return sum(seen.values())

    def logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """hidden: [n, dim] after the final norm -> [n, vocab] float32 logits (perhaps written
        into `out`, an [n, vocab] float32 buffer the caller reuses)."""
        return self.ops.linear(hidden, self.lm_head, out=out).float()

    # --- prefill: prompt chunks of one or more sequences ------------------------------

    def prefill(self, segments: list[Segment], cache: KVCache, routes: list[torch.Tensor] | None = None,
                forced: torch.Tensor | None = None) -> torch.Tensor:
        """Prompt chunks -> final hidden states [total tokens, dim], segment after segment (and,
        given `routes`, each MoE layer's expert ids [total tokens, k] appended to it; given
        `forced` [total tokens, MoE layers, k], those experts used where its ids are not -1).

        Matmuls run over every segment's rows at once; attention runs per segment, causal,
        over that sequence's own cache region.
        """
        device = self.device
        token_ids = torch.cat([seg.token_ids for seg in segments])
        positions = torch.cat([torch.arange(seg.start, seg.start + len(seg.token_ids), device=device)
                               for seg in segments])
        bounds = torch.tensor([0, *(len(seg.token_ids) for seg in segments)]).cumsum(0).tolist()
        x = self._embed(token_ids)  # [n, dim]
        for i, layer in enumerate(self.layers):
            h = self._norm(x, layer.attn_norm)
            q, k, v = self._qkv(i, layer, h, positions)
            attn = torch.cat([self._prefill_attention(i, seg, q[a:b], k[a:b], v[a:b], cache)
                              for seg, a, b in zip(segments, bounds, bounds[1:])])
            x = self._add(x, attn, layer.wo, layer.post_attn_norm)
            x = self._mlp(layer, x, routes, None if forced is None or i not in self.moe_index
                          else forced[:, self.moe_index[i]])
        return self._norm(x, self.final_norm)

    def _prefill_attention(self, layer: int, seg: Segment, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           cache: KVCache) -> torch.Tensor:
        """q: [n, heads, hd], k and v: [n, kv_heads, hd] of one segment -> [n, q_dim]."""
        cache.write_prompt(layer, seg.slot, seg.start, k.transpose(0, 1), v.transpose(0, 1))
        return self.ops.prompt_attention(q, cache, layer, seg.slot, seg.start, self.scale,
                                         self.windows[layer]).flatten(1)

    # --- decode: one new token for each of several sequences ------------------------

    def decode(self, token_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               num_real: int, cache: KVCache, routes: list[torch.Tensor] | None = None) -> torch.Tensor:
        """token_ids, positions, slots: [rows], of which the first num_real are sequences and
        the rest padding -> final hidden states [rows, dim].

        Matmuls run over all rows; attention runs per sequence over that sequence's own
        keys, so no row's arithmetic depends on how many others share the step.
        """
        x = self._embed(token_ids)  # [rows, dim]
        x = self.ops.decode_layers(self, x, positions, slots, num_real, cache, routes)
        return self._norm(x, self.final_norm)

    def decode_layers(self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, num_real: int,
                      cache: KVCache, routes: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Every layer, one op at a time (the ops may run the same ops in one call instead)."""
        real_slots, real_pos = slots[:num_real], positions[:num_real]
        lengths = real_pos + 1
        for i, layer in enumerate(self.layers):
            h = self._norm(x, layer.attn_norm)
            q, k, v = self._qkv(i, layer, h, positions)
            cache.write_step(i, real_slots, real_pos, k[:num_real], v[:num_real])
            attn = self.ops.decode_attention(q[:num_real], cache, i, real_slots, lengths, self.scale,
                                             self.windows[i]).flatten(1)
            if num_real < x.shape[0]:  # padding rows attend to nothing
                attn = torch.cat([attn, attn.new_zeros(x.shape[0] - num_real, self.q_dim)])
            x = self._add(x, attn, layer.wo, layer.post_attn_norm)
            x = self._mlp(layer, x, routes)
        return x
