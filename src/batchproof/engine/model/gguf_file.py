"""Reading a GGUF file: hyperparameters, tokenizer metadata, and tensors (dequantized, or
the matmul weights kept in their blocks for the native kernels)."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from batchproof.engine.model.gguf_reader import GGUFFormatError, TensorInfo, read_gguf
from batchproof.engine.model.weights import RawTensor

GGUF_MAGIC = b"GGUF"

# GGUF tensor name -> our weight name; `blk.N.` prefixes are stripped before lookup.
GLOBAL_TENSOR_NAMES: dict[str, str] = {
    "token_embd.weight": "embed",
    "output_norm.weight": "final_norm",
    "output.weight": "lm_head",
    "rope_freqs.weight": "rope_freqs",
}
LAYER_TENSOR_NAMES: dict[str, str] = {
    "attn_norm.weight": "attn_norm",
    "attn_q.weight": "wq",
    "attn_k.weight": "wk",
    "attn_v.weight": "wv",
    "attn_q.bias": "bq",
    "attn_k.bias": "bk",
    "attn_v.bias": "bv",
    "attn_q_norm.weight": "q_norm",
    "attn_k_norm.weight": "k_norm",
    "attn_output.weight": "wo",
    "ffn_norm.weight": "ffn_norm",
    "ffn_gate.weight": "w_gate",
    "ffn_up.weight": "w_up",
    "ffn_down.weight": "w_down",
}

# The weights the native kernels multiply from their blocks; the rest (norms, biases,
# RoPE factors) are small and always dequantized.
MATMUL_WEIGHTS = {"embed", "lm_head", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"}

# How each architecture's file lays out Q/K for RoPE: llama.cpp's converter permutes
# llama Q/K rows so rotation pairs are adjacent; qwen files keep Hugging Face's halves.
ROPE_STYLES: dict[str, Literal["adjacent", "halves"]] = {
    "llama": "adjacent",
    "qwen2": "halves",
    "qwen3": "halves",
}


class ModelLoadError(Exception):
    """A model file we cannot use; the message is one line naming the file and the problem."""


@dataclass(frozen=True)
class ModelSpec:
    """Hyperparameters, all read from the file's metadata."""

    arch: str
    num_layers: int
    dim: int
    ffn_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    context_len: int
    rope_base: float
    rope_dim: int
    rope_style: Literal["adjacent", "halves"]
    norm_eps: float


@dataclass
class ModelFile:
    path: Path
    spec: ModelSpec
    metadata: dict[str, Any]
    # name -> float32 array (or RawTensor when kept quantized); layer tensors are keyed
    # "layers.N.<name>".
    tensors: dict[str, np.ndarray | RawTensor]


def _tensor_bytes(type_id: int, dims: tuple[int, ...]) -> int | None:
    import gguf

    try:
        block_size, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(type_id)]
    except (ValueError, KeyError):
        return None
    return int(np.prod(dims, dtype=np.int64)) // block_size * type_size


def _open(path: Path) -> tuple[dict[str, Any], list[TensorInfo]]:
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file")
    if not path.is_file():
        raise ModelLoadError(f"{path}: not a regular file")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"{path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    try:
        return read_gguf(path, _tensor_bytes)
    except (GGUFFormatError, ValueError, OSError) as e:
        raise ModelLoadError(f"{path}: truncated or corrupt GGUF file ({e})") from None


def _spec(meta: dict[str, Any], tensors: dict[str, np.ndarray | RawTensor], path: Path) -> ModelSpec:
    arch = meta.get("general.architecture")
    if arch not in ROPE_STYLES:
        raise ModelLoadError(
            f"{path}: architecture {arch!r} is not supported (supported: {', '.join(ROPE_STYLES)})"
        )

    def need(key: str) -> Any:
        full = f"{arch}.{key}"
        if full not in meta:
            raise ModelLoadError(f"{path}: metadata key {full!r} is missing")
        return meta[full]

    dim, num_heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", dim // num_heads))
    if "embed" not in tensors:
        raise ModelLoadError(f"{path}: tensor 'token_embd.weight' is missing")
    return ModelSpec(
        arch=arch,
        num_layers=int(need("block_count")),
        dim=dim,
        ffn_dim=int(need("feed_forward_length")),
        num_heads=num_heads,
        num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        vocab_size=int(tensors["embed"].shape[0]),
        context_len=int(need("context_length")),
        rope_base=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        rope_dim=int(meta.get(f"{arch}.rope.dimension_count", head_dim)),
        rope_style=ROPE_STYLES[arch],
        norm_eps=float(need("attention.layer_norm_rms_epsilon")),
    )


def _our_name(gguf_name: str) -> str | None:
    if gguf_name.startswith("blk."):
        _, layer, rest = gguf_name.split(".", 2)
        short = LAYER_TENSOR_NAMES.get(rest)
        return None if short is None else f"layers.{layer}.{short}"
    return GLOBAL_TENSOR_NAMES.get(gguf_name)


def _dequantize(tensor: TensorInfo, path: Path) -> np.ndarray:
    import gguf.quants

    qtype = gguf.GGMLQuantizationType(tensor.type_id)
    try:
        values = gguf.quants.dequantize(tensor.data, qtype)
    except (NotImplementedError, KeyError, ValueError, TypeError) as e:
        raise ModelLoadError(
            f"{path}: tensor {tensor.name!r} has type {qtype.name}, which we cannot read ({e})"
        ) from None
    values = np.ascontiguousarray(values.reshape(tensor.shape), dtype=np.float32)
    # F32 tensors come back as read-only views of the mapped file; torch wants its own copy.
    return values if values.flags.writeable else values.copy()


def _raw(tensor: TensorInfo, path: Path, runs_natively: Callable[[int], bool]) -> RawTensor:
    import gguf

    if not runs_natively(tensor.type_id):
        type_name = gguf.GGMLQuantizationType(tensor.type_id).name
        raise ModelLoadError(f"{path}: tensor {tensor.name!r} has type {type_name}, which the native "
                             "kernels do not run; --weights float32 runs it dequantized")
    return RawTensor(tensor.data.reshape(tensor.shape[0], -1), tensor.type_id, tensor.shape)


def read_model_file(path: Path, runs_natively: Callable[[int], bool] | None = None) -> ModelFile:
    """runs_natively: keep the matmul weights whose type it accepts as RawTensor blocks
    (any other type is refused, naming the tensor); None dequantizes everything."""
    path = Path(path)
    meta, file_tensors = _open(path)
    tensors: dict[str, np.ndarray | RawTensor] = {}
    for tensor in file_tensors:
        name = _our_name(tensor.name)
        if name is None:
            continue
        is_float32 = tensor.type_id == 0  # F32 blocks are float32 already: a plain array
        if runs_natively is not None and name.rsplit(".", 1)[-1] in MATMUL_WEIGHTS and not is_float32:
            tensors[name] = _raw(tensor, path, runs_natively)
        else:
            tensors[name] = _dequantize(tensor, path)
    spec = _spec(meta, tensors, path)
    return ModelFile(path=path, spec=spec, metadata=meta, tensors=tensors)
