"""A random-weight GGUF in a real model's shapes, for the speed and memory benches only.

The packaged models are 135M and 270M parameters; people serve 1B-8B, where the weights no
longer sit in cache and the ratio against llama-server moved from 1.03x to 0.41x on one
stream (issue 40). No 1B file ships with us, so `batchproof bench --write-model PATH` writes
one: Llama 3.2 1B's shapes, the default model's tokenizer and chat template, and quantized
blocks of random quants with scales drawn so every weight row has entries of variance 1/K
(K: the row's length), which keeps the forward pass finite and the logits ordinary. The
weights mean nothing, so its text is noise; the kernels' work per token is a real 1B model's.

The tensor types follow llama.cpp's quantize (src/llama-quant.cpp, llama_tensor_get_type):
with tied embeddings (Llama 3.2 1B has no output.weight) token_embd is quantized as the
output would be, Q6_K, under both Q4_0 and Q4_K_M; Q4_K_M gives attn_v and ffn_down Q6_K in
the layers its `use_more_bits` picks and Q4_K elsewhere. Llama 3's RoPE scaling (rope_freqs)
is left out: it changes frequencies, not work.

The same writer gives a Llama 3.2 3B shape (issue 62) and an OLMoE-1B-7B-shaped mixture of
experts (issue 63): the `olmoe` keys and tensors llama.cpp's converter writes (expert_count,
expert_used_count, a float32 router `ffn_gate_inp`, the experts stacked [experts, rows, K] in
`ffn_{gate,up,down}_exps`, Q and K norms over the whole projection, an untied `output`), typed as
its quantize types them: the router is never quantized, `ffn_down_exps` takes ffn_down's rule,
and with 64 experts (not 8) attn_k and attn_output keep the mix's type.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import gguf
import numpy as np

from batchproof.engine.model.gguf.reader import read_gguf
from batchproof.engine.model.known_models import resolve_model

Q = gguf.GGMLQuantizationType
Mix = Literal["q4_k_m", "q4_0"]
MIXES: tuple[Mix, ...] = ("q4_k_m", "q4_0")
FILE_TYPES = {"q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}
# The logits' standard deviation: the final norm leaves unit-RMS rows, so embedding entries of
# variance LOGIT_STD**2 / dim give logits of about this spread (a top token, not a flat row).
LOGIT_STD = 3.0
TOKENIZER_PREFIX = "tokenizer."


ARCHS = ("llama", "olmoe")


@dataclass(frozen=True)
class Shape:
    num_layers: int
    dim: int
    ffn_dim: int  # in a mixture of experts, one expert's (llama.cpp's olmoe feed_forward_length)
    num_heads: int
    num_kv_heads: int
    context_len: int = 4096
    rope_base: float = 500000.0
    norm_eps: float = 1e-5
    arch: str = "llama"
    num_experts: int = 0  # 0: a dense MLP
    num_experts_used: int = 0

    def __post_init__(self) -> None:
        # every row is whole K-quant blocks (the Q4_0 file too: its embedding is Q6_K)
        if self.dim % 256 or self.ffn_dim % 256 or self.dim % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self}: dims must be multiples of 256, the heads divide dim, the KV heads the heads")
        if self.arch not in ARCHS:
            raise ValueError(f"{self}: arch is one of {', '.join(ARCHS)}")
        # llama here is dense (a Mixtral is not written); llama-server refuses an olmoe whose
        # attn_k_norm is not the hidden size, so its KV heads are its heads
        if self.arch == "olmoe" and not (0 < self.num_experts_used <= self.num_experts
                                         and self.num_kv_heads == self.num_heads):
            raise ValueError(f"{self}: an olmoe has 0 < num_experts_used <= num_experts and no GQA")
        if self.arch == "llama" and (self.num_experts or self.num_experts_used):
            raise ValueError(f"{self}: a llama shape here is dense (num_experts 0)")

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def is_tied(self) -> bool:
        """Llama 3.2's embedding doubles as its output; OLMoE has an output.weight of its own."""
        return self.arch == "llama"


# Llama 3.2 1B's and 3B's config.json, OLMoE-1B-7B-0924's (their vocabularies aside: the
# tokenizer is ours, 49,152 tokens against 128,256 and 50,304).
SHAPES = {
    "llama-1b": Shape(num_layers=16, dim=2048, ffn_dim=8192, num_heads=32, num_kv_heads=8),
    "llama-3b": Shape(num_layers=28, dim=3072, ffn_dim=8192, num_heads=24, num_kv_heads=8),
    "olmoe-1b-7b": Shape(num_layers=16, dim=2048, ffn_dim=1024, num_heads=16, num_kv_heads=16, rope_base=10000.0,
                         arch="olmoe", num_experts=64, num_experts_used=8),
}


def use_more_bits(layer: int, num_layers: int) -> bool:
    """llama.cpp's rule for the layers Q4_K_M gives 6 bits: the first and last eighth, and
    every third layer between."""
    return layer < num_layers // 8 or layer >= 7 * num_layers // 8 or (layer - num_layers // 8) % 3 == 2


def tensor_type(mix: Mix, short: str, layer: int, num_layers: int, is_tied: bool = True) -> Q:
    """The type llama.cpp's quantize gives a tensor ("token_embd", "output", or a layer's
    "attn_v"...). Its rules for 8-expert models (Mixtral) do not apply at 64 experts."""
    if short == "output" or (short == "token_embd" and is_tied):
        return Q.Q6_K  # the output, or the embedding quantized as the output it doubles as
    if mix == "q4_0":
        return Q.Q4_0
    if short in ("attn_v", "ffn_down", "ffn_down_exps") and use_more_bits(layer, num_layers):
        return Q.Q6_K
    return Q.Q4_K


@dataclass(frozen=True)
class Tensor:
    name: str
    rows: int
    k: int  # the row's length (the matmul's input size)
    qtype: Q
    num_experts: int = 0  # > 0: that many [rows, k] matrices stacked, as llama.cpp stores experts

    @property
    def num_params(self) -> int:
        return max(self.num_experts, 1) * self.rows * self.k

    @property
    def num_bytes(self) -> int:
        block_elems, block_bytes = gguf.GGML_QUANT_SIZES[self.qtype]
        return self.num_params // block_elems * block_bytes

    @property
    def byte_shape(self) -> tuple[int, ...]:
        """As gguf's writer takes raw bytes: [rows, row bytes], a norm's one row as a vector,
        stacked experts [experts, rows, row bytes]."""
        row_bytes = self.num_bytes // (max(self.num_experts, 1) * self.rows)
        if self.num_experts:
            return (self.num_experts, self.rows, row_bytes)
        return (self.num_bytes,) if self.rows == 1 else (self.rows, row_bytes)


def _layer_shapes(shape: Shape) -> dict[str, tuple[int, int]]:
    """A layer's tensors: short name -> (rows, row length); a norm is one row."""
    dim, q_dim, kv_dim = shape.dim, shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    out = {"attn_norm": (1, dim), "attn_q": (q_dim, dim), "attn_k": (kv_dim, dim), "attn_v": (kv_dim, dim),
           "attn_output": (dim, q_dim)}
    if shape.arch == "olmoe":  # its Q and K norms span the whole projection
        out |= {"attn_q_norm": (1, q_dim), "attn_k_norm": (1, kv_dim)}
    out["ffn_norm"] = (1, dim)
    if shape.num_experts:  # the router, then each expert's matrix of the three (stacked)
        return out | {"ffn_gate_inp": (shape.num_experts, dim), "ffn_gate_exps": (shape.ffn_dim, dim),
                      "ffn_up_exps": (shape.ffn_dim, dim), "ffn_down_exps": (dim, shape.ffn_dim)}
    return out | {"ffn_gate": (shape.ffn_dim, dim), "ffn_up": (shape.ffn_dim, dim), "ffn_down": (dim, shape.ffn_dim)}


def tensors(shape: Shape, mix: Mix, vocab_size: int) -> list[Tensor]:
    """Every tensor of the model, in the order written."""
    out = [Tensor("token_embd.weight", vocab_size, shape.dim,
                  tensor_type(mix, "token_embd", 0, shape.num_layers, shape.is_tied)),
           Tensor("output_norm.weight", 1, shape.dim, Q.F32)]
    if not shape.is_tied:
        out.append(Tensor("output.weight", vocab_size, shape.dim, Q.Q6_K))
    for i in range(shape.num_layers):
        for short, (rows, k) in _layer_shapes(shape).items():
            # norms and the router stay float32: quantize skips 1-D tensors and ffn_gate_inp
            is_float = short.endswith("norm") or short == "ffn_gate_inp"
            qtype = Q.F32 if is_float else tensor_type(mix, short, i, shape.num_layers)
            num_experts = shape.num_experts if short.endswith("_exps") else 0
            out.append(Tensor(f"blk.{i}.{short}.weight", rows, k, qtype, num_experts))
    return out


# --- random blocks, [rows, row bytes] uint8, every weight of variance std**2 ----------------


def _signs(rng: np.random.Generator, n: tuple[int, ...]) -> np.ndarray:
    """A random sign per block: each block's weights then have mean zero over the matrix."""
    return rng.choice(np.array([-1.0, 1.0]), size=n)


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(*values.shape, 2)


def q4_0_blocks(rng: np.random.Generator, rows: int, k: int, std: float) -> np.ndarray:
    """d (f16), 16 bytes of 4-bit quants q; weight = d * (q - 8), E[(q - 8)^2] = 21.5."""
    n = (rows, k // 32)
    blocks = rng.integers(0, 256, (*n, 18), dtype=np.uint8)
    blocks[..., 0:2] = _f16_bytes(_signs(rng, n) * std / np.sqrt(21.5))
    return blocks.reshape(rows, -1)


def q4_k_blocks(rng: np.random.Generator, rows: int, k: int, std: float) -> np.ndarray:
    """d, dmin (f16), twelve bytes of 6-bit scales sc and mins m for eight sub-blocks, 4-bit
    quants q; weight = d * sc * q - dmin * m. With dmin = 8 d and m = sc * 15/16 each
    sub-block's mean (d * sc * 7.5 - dmin * m) is nearly zero; var(q) = 21.25."""
    n = (rows, k // 256)
    blocks = rng.integers(0, 256, (*n, 144), dtype=np.uint8)
    sc = rng.integers(16, 64, (*n, 8), dtype=np.uint8)
    m = np.rint(sc * (15 / 16)).astype(np.uint8)
    d = _signs(rng, n) * std / np.sqrt(21.25 * (sc.astype(np.float64) ** 2).mean(-1))
    blocks[..., 0:2], blocks[..., 2:4] = _f16_bytes(d), _f16_bytes(8 * d)
    # ggml's get_scale_min_k4 packing: sub-blocks 0-3 in the low six bits, 4-7's top two bits above them
    blocks[..., 4:8] = sc[..., :4] | ((sc[..., 4:] >> 4) << 6)
    blocks[..., 8:12] = m[..., :4] | ((m[..., 4:] >> 4) << 6)
    blocks[..., 12:16] = (sc[..., 4:] & 0xF) | ((m[..., 4:] & 0xF) << 4)
    return blocks.reshape(rows, -1)


def q6_k_blocks(rng: np.random.Generator, rows: int, k: int, std: float) -> np.ndarray:
    """128 + 64 bytes of 6-bit quants q, sixteen int8 scales s, d (f16); weight =
    d * s * (q - 32), E[(q - 32)^2] = 341.5."""
    n = (rows, k // 256)
    blocks = rng.integers(0, 256, (*n, 210), dtype=np.uint8)
    scales = rng.integers(16, 128, (*n, 16)) * _signs(rng, (*n, 16))
    blocks[..., 192:208] = scales.astype(np.int8).view(np.uint8)
    d = std / np.sqrt(341.5 * (scales**2).mean(-1))
    blocks[..., 208:210] = _f16_bytes(d)
    return blocks.reshape(rows, -1)


BLOCK_WRITERS: dict[Q, Callable[[np.random.Generator, int, int, float], np.ndarray]] = {
    Q.Q4_0: q4_0_blocks, Q.Q4_K: q4_k_blocks, Q.Q6_K: q6_k_blocks}


def tensor_data(rng: np.random.Generator, tensor: Tensor, dim: int) -> np.ndarray:
    """The tensor's bytes: a norm's ones, a router's float32 normals, or blocks of weights with
    variance 1/K (the embedding and output: logits of spread LOGIT_STD). Stacked experts are
    drawn as one matrix of all their rows: the same distribution, in the file's order."""
    if tensor.qtype == Q.F32 and tensor.rows == 1:
        return np.ones(tensor.k, dtype=np.float32).view(np.uint8)
    std = LOGIT_STD / np.sqrt(dim) if tensor.name in ("token_embd.weight", "output.weight") else 1 / np.sqrt(tensor.k)
    rows = max(tensor.num_experts, 1) * tensor.rows
    if tensor.qtype == Q.F32:  # the router: logits of unit spread, so tokens spread over the experts
        return (rng.standard_normal((rows, tensor.k)) * std).astype(np.float32).view(np.uint8)
    return BLOCK_WRITERS[tensor.qtype](rng, rows, tensor.k, std)


# --- the file ------------------------------------------------------------------------------


def _add_tokenizer(writer: gguf.GGUFWriter, source: Path) -> int:
    """The tokenizer.* keys (chat template included) of `source`, with their GGUF types; returns
    the vocabulary's size."""
    meta, _ = read_gguf(source)
    for key, value in meta.items():
        if not key.startswith(TOKENIZER_PREFIX):
            continue
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):  # token ids: uint32, as llama.cpp writes them
            writer.add_uint32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:  # tokens and merges (strings), token types (int32): gguf infers the item type
            writer.add_array(key, value)
    return len(meta["tokenizer.ggml.tokens"])


def _add_hyperparameters(writer: gguf.GGUFWriter, shape: Shape, mix: Mix, name: str) -> None:
    writer.add_name(name)
    writer.add_file_type(FILE_TYPES[mix])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_block_count(shape.num_layers)
    writer.add_context_length(shape.context_len)
    writer.add_embedding_length(shape.dim)
    writer.add_feed_forward_length(shape.ffn_dim)
    writer.add_head_count(shape.num_heads)
    writer.add_head_count_kv(shape.num_kv_heads)
    if shape.arch == "llama":  # llama.cpp's converter writes it for llama, not for olmoe
        writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_layer_norm_rms_eps(shape.norm_eps)
    if shape.num_experts:  # as llama.cpp's converter writes them: no expert_feed_forward_length
        writer.add_expert_count(shape.num_experts)
        writer.add_expert_used_count(shape.num_experts_used)


def write(path: Path, shape: Shape, mix: Mix, tokenizer_from: Path | str | None = None, seed: int = 0) -> list[Tensor]:
    """Writes the file, one tensor at a time (the largest: the embedding, 83 MB at 1B; a stacked
    expert tensor, 110 MB at OLMoE's shape):
    the directory first, then each tensor's blocks drawn and written. The tokenizer is
    `tokenizer_from`'s (a GGUF or a packaged model's name; None: the default model's).
    Returns the tensors written."""
    if mix not in MIXES:
        raise ValueError(f"mix {mix!r} is not one of {', '.join(MIXES)}")
    path = Path(path)
    partial = path.with_name(path.name + ".partial")  # PATH appears only once whole
    writer = gguf.GGUFWriter(str(partial), shape.arch)
    vocab_size = _add_tokenizer(writer, resolve_model(tokenizer_from))
    _add_hyperparameters(writer, shape, mix, f"random {mix} weights in a {shape.arch} shape (speed benches only)")
    listed = tensors(shape, mix, vocab_size)
    for t in listed:
        writer.add_tensor_info(t.name, t.byte_shape, np.dtype(np.uint8), t.num_bytes, raw_dtype=t.qtype)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        rng = np.random.default_rng(seed)
        for t in listed:  # one tensor's blocks alive at a time
            writer.write_tensor_data(tensor_data(rng, t, shape.dim))
        writer.close()
        partial.replace(path)
    finally:
        writer.close()
        partial.unlink(missing_ok=True)  # a run cut short (a full disk) leaves nothing behind
    return listed
