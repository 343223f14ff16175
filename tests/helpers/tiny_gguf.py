"""Tiny random GGUF models (llama / qwen2 / qwen3 / gemma3) and a naive float64 reference forward.

The weights are drawn in Hugging Face's layout; the writer stores them the way llama.cpp's
converter does (llama Q/K rows permuted for GGML's adjacent-pair RoPE, qwen kept as is),
so `reference_logits`, written from Hugging Face's modelling code with rotate-half RoPE,
is a second route to the logits that shares nothing with the engine's forward pass.
"""

from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
import torch

from batchproof.engine.text.tokenizer import bytes_to_unicode
from tests.helpers import tiny_spm
from tests.helpers.quant_blocks import SCALE_OFFSETS, random_blocks

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Merges over GPT-2's byte alphabet ("Ġ" is the space byte); each result becomes a token.
MERGES: list[tuple[str, str]] = [
    ("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "t"), ("Ġt", "he"),
    ("i", "n"), ("Ġ", "a"), ("Ġa", "n"), ("Ġan", "d"), ("\u010a", "\u010a"),  # "\n\n"
]
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3


def vocab() -> tuple[list[str], list[int]]:
    """Tokens and token types: the 256 bytes in byte order, the merge results, the specials."""
    byte_chars = bytes_to_unicode()
    tokens = [byte_chars[b] for b in range(256)]
    tokens += [a + b for a, b in MERGES]
    types = [TOKEN_NORMAL] * len(tokens)
    tokens += SPECIAL_TOKENS
    types += [TOKEN_CONTROL] * len(SPECIAL_TOKENS)
    return tokens, types


def token_id(spelling: str) -> int:
    return vocab()[0].index(spelling)


@dataclass(frozen=True)
class TinySpec:
    arch: str = "llama"  # llama, qwen2, qwen3 or gemma3
    num_layers: int = 2
    dim: int = 64
    ffn_dim: int = 96
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int | None = None  # default dim // num_heads; qwen3 may differ
    context_len: int = 128
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    pre: str = "gpt2"
    tie_embeddings: bool = False
    sliding_window: int = 4  # gemma3: the local layers' window (every 6th layer is global)
    tokenizer: str = "gpt2"  # gpt2: the byte-level vocabulary here; llama: tiny_spm's SentencePiece one
    seed: int = 0
    # GGUF tensor name -> storage type other than F32 (gguf quantizes F16, BF16, Q4_0..Q8_0; the
    # K-quants are random blocks and Q8_1 random bytes, so their values are not `weights`).
    tensor_types: dict[str, gguf.GGMLQuantizationType] = field(default_factory=dict)

    @property
    def hd(self) -> int:
        return self.head_dim or self.dim // self.num_heads

    @property
    def has_biases(self) -> bool:
        return self.arch == "qwen2"

    @property
    def has_qk_norm(self) -> bool:
        return self.arch in ("qwen3", "gemma3")

    @property
    def is_gemma(self) -> bool:
        return self.arch == "gemma3"

    def window(self, layer: int) -> int:
        """gemma3 (as llama.cpp and Hugging Face lay it out): five local layers, then a global one."""
        return self.sliding_window if self.is_gemma and (layer + 1) % 6 else 0


def hf_weights(spec: TinySpec) -> dict[str, np.ndarray]:
    """Random float32 weights keyed by GGUF tensor name, in Hugging Face's layout ([out, in])."""
    rng = np.random.default_rng(spec.seed)
    vocab_size = len(tiny_spm.vocab()[0] if spec.tokenizer == "llama" else vocab()[0])
    q_dim, kv_dim = spec.num_heads * spec.hd, spec.num_kv_heads * spec.hd

    def mat(out_dim: int, in_dim: int) -> np.ndarray:
        return (rng.standard_normal((out_dim, in_dim)) / np.sqrt(in_dim)).astype(np.float32)

    def norm(n: int) -> np.ndarray:  # Gemma's weights are offsets from 1 (it multiplies by 1 + w)
        return ((0.0 if spec.is_gemma else 1.0) + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": rng.standard_normal((vocab_size, spec.dim)).astype(np.float32),
         "output_norm.weight": norm(spec.dim)}
    if not spec.tie_embeddings:
        w["output.weight"] = mat(vocab_size, spec.dim)
    for i in range(spec.num_layers):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(spec.dim)
        w[p + "attn_q.weight"] = mat(q_dim, spec.dim)
        w[p + "attn_k.weight"] = mat(kv_dim, spec.dim)
        w[p + "attn_v.weight"] = mat(kv_dim, spec.dim)
        if spec.has_biases:
            for name, n in (("attn_q.bias", q_dim), ("attn_k.bias", kv_dim), ("attn_v.bias", kv_dim)):
                w[p + name] = (0.5 * rng.standard_normal(n)).astype(np.float32)
        if spec.has_qk_norm:
            w[p + "attn_q_norm.weight"] = norm(spec.hd)
            w[p + "attn_k_norm.weight"] = norm(spec.hd)
        w[p + "attn_output.weight"] = mat(spec.dim, q_dim)
        w[p + "ffn_norm.weight"] = norm(spec.dim)
        if spec.is_gemma:
            w[p + "post_attention_norm.weight"] = norm(spec.dim)
            w[p + "post_ffw_norm.weight"] = norm(spec.dim)
        w[p + "ffn_gate.weight"] = mat(spec.ffn_dim, spec.dim)
        w[p + "ffn_up.weight"] = mat(spec.ffn_dim, spec.dim)
        w[p + "ffn_down.weight"] = mat(spec.dim, spec.ffn_dim)
    return w


def llama_permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permute of Q/K rows (rotate-half -> adjacent pairs)."""
    rows = weights.shape[0]
    return (weights.reshape(num_heads, 2, rows // num_heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def file_weights(spec: TinySpec, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays as the GGUF stores them (llama Q/K permuted, gemma norms stored as 1 + w, as
    llama.cpp writes them)."""
    out = dict(weights)
    if spec.is_gemma:
        for name in weights:
            if name.endswith("norm.weight"):
                out[name] = weights[name] + np.float32(1.0)
    if spec.arch == "llama":
        for name in weights:
            if name.endswith("attn_q.weight"):
                out[name] = llama_permute(weights[name], spec.num_heads)
            elif name.endswith("attn_k.weight"):
                out[name] = llama_permute(weights[name], spec.num_kv_heads)
    return out


def write_tiny_gguf(path: Path, spec: TinySpec = TinySpec(), weights: dict[str, np.ndarray] | None = None,
                    drop_keys: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Writes the model to `path` (without the metadata keys in `drop_keys`); returns its
    Hugging Face-layout weights (before any quantization)."""
    weights = hf_weights(spec) if weights is None else weights
    tokens, types = vocab()
    arch = spec.arch
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(spec.num_layers)
    writer.add_context_length(spec.context_len)
    writer.add_embedding_length(spec.dim)
    writer.add_feed_forward_length(spec.ffn_dim)
    writer.add_head_count(spec.num_heads)
    writer.add_head_count_kv(spec.num_kv_heads)
    writer.add_layer_norm_rms_eps(spec.norm_eps)
    writer.add_rope_freq_base(spec.rope_base)
    if spec.head_dim is not None:
        writer.add_key_length(spec.hd)
        writer.add_value_length(spec.hd)
    if spec.is_gemma:
        writer.add_sliding_window(spec.sliding_window)
    else:
        writer.add_rope_dimension_count(spec.hd)  # llama.cpp writes none for gemma3
    if spec.tokenizer == "llama":
        tiny_spm.add_tokenizer(writer)
    else:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(spec.pre)
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges([f"{a} {b}" for a, b in MERGES])
        writer.add_bos_token_id(tokens.index("<|im_start|>"))
        writer.add_eos_token_id(tokens.index("<|im_end|>"))
        writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)
    for key in drop_keys:
        del writer.kv_data[0][key]
    for name, array in file_weights(spec, weights).items():
        qtype = spec.tensor_types.get(name, gguf.GGMLQuantizationType.F32)
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, array)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, array.astype(np.float16))
        elif qtype in SCALE_OFFSETS and qtype.name.endswith("_K"):  # no quantizer for K-quants: random blocks
            writer.add_tensor(name, random_blocks(qtype, *array.shape, seed=spec.seed), raw_dtype=qtype)
        elif qtype == gguf.GGMLQuantizationType.BF16:
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        elif qtype == gguf.GGMLQuantizationType.Q8_1:  # no quantizer for it: raw bytes of the right size
            block, type_size = gguf.GGML_QUANT_SIZES[qtype]
            raw = np.random.default_rng(1).integers(0, 256, (array.shape[0], array.shape[1] // block * type_size),
                                                    dtype=np.uint8)
            writer.add_tensor(name, raw, raw_dtype=qtype)
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights


# --- a naive float64 forward pass, after Hugging Face's modelling code -----------------------


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def _norm_weight(spec: TinySpec, w: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    return 1.0 + w[name] if spec.is_gemma else w[name]


def _rope(spec: TinySpec, base: float, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    hd = spec.hd
    inv_freq = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = torch.outer(torch.arange(n, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)  # [n, hd]
    return emb.cos()[:, None, :], emb.sin()[:, None, :]


def reference_logits(spec: TinySpec, weights: dict[str, np.ndarray], token_ids: list[int]) -> torch.Tensor:
    """[len(token_ids), vocab] float64 logits from Hugging Face-layout weights, no cache."""
    w = {k: torch.from_numpy(v.astype(np.float64)) for k, v in weights.items()}
    n, hd = len(token_ids), spec.hd
    group = spec.num_heads // spec.num_kv_heads
    pos = torch.arange(n)
    x = w["token_embd.weight"][token_ids]  # [n, dim]
    if spec.is_gemma:
        x = x * spec.dim**0.5
    for i in range(spec.num_layers):
        p = f"blk.{i}."
        cos, sin = _rope(spec, 10000.0 if spec.window(i) else spec.rope_base, n)
        visible = pos[None, :] <= pos[:, None]  # [query, key]
        if spec.window(i):
            visible &= pos[None, :] > pos[:, None] - spec.window(i)
        h = _rms_norm(x, _norm_weight(spec, w, p + "attn_norm.weight"), spec.norm_eps)
        q = h @ w[p + "attn_q.weight"].T
        k = h @ w[p + "attn_k.weight"].T
        v = h @ w[p + "attn_v.weight"].T
        if spec.has_biases:
            q, k, v = q + w[p + "attn_q.bias"], k + w[p + "attn_k.bias"], v + w[p + "attn_v.bias"]
        q = q.view(n, spec.num_heads, hd)
        k = k.view(n, spec.num_kv_heads, hd)
        v = v.view(n, spec.num_kv_heads, hd)
        if spec.has_qk_norm:
            q = _rms_norm(q, _norm_weight(spec, w, p + "attn_q_norm.weight"), spec.norm_eps)
            k = _rms_norm(k, _norm_weight(spec, w, p + "attn_k_norm.weight"), spec.norm_eps)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k = k.repeat_interleave(group, dim=1)  # [n, heads, hd]
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / hd**0.5
        scores = scores.masked_fill(~visible, float("-inf"))
        attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, spec.num_heads * hd)
        out = attn @ w[p + "attn_output.weight"].T
        if spec.is_gemma:
            out = _rms_norm(out, _norm_weight(spec, w, p + "post_attention_norm.weight"), spec.norm_eps)
        x = x + out
        h = _rms_norm(x, _norm_weight(spec, w, p + "ffn_norm.weight"), spec.norm_eps)
        gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        act = (torch.nn.functional.gelu(gate, approximate="tanh") if spec.is_gemma
               else torch.nn.functional.silu(gate))
        out = (act * up) @ w[p + "ffn_down.weight"].T
        if spec.is_gemma:
            out = _rms_norm(out, _norm_weight(spec, w, p + "post_ffw_norm.weight"), spec.norm_eps)
        x = x + out
    x = _rms_norm(x, _norm_weight(spec, w, "output_norm.weight"), spec.norm_eps)
    head = w.get("output.weight", w["token_embd.weight"])
    return x @ head.T
