"""Reading a GGUF file: hyperparameters, tokenizer metadata, and tensors (dequantized, or
the matmul weights kept in their blocks for the native kernels)."""

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from batchproof.engine.memory import drop_mapped_file_pages
from batchproof.engine.model.gguf_reader import GGUFFormatError, TensorEntry, read_gguf
from batchproof.engine.model.tensor_names import our_name
from batchproof.engine.model.validate import (
    Metadata,
    ModelLoadError,
    check_heads,
    check_tensors,
    check_vocabulary,
    head_size,
    shown,
)
from batchproof.engine.model.weights import RawTensor

GGUF_MAGIC = b"GGUF"

# The weights the native kernels multiply from their blocks; the rest (norms, biases,
# RoPE factors) are small and always dequantized.
MATMUL_WEIGHTS = {"embed", "lm_head", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"}

# How each architecture's file lays out Q/K for RoPE: llama.cpp's converter permutes
# llama Q/K rows so rotation pairs are adjacent; qwen files keep Hugging Face's halves.
ROPE_STYLES: dict[str, Literal["adjacent", "halves"]] = {
    "llama": "adjacent",
    "qwen2": "halves",
    "qwen3": "halves",
    "gemma3": "halves",
}

# Gemma 3 (llama.cpp's gemma3 code): every 6th layer attends globally, the rest within a
# sliding window; the local layers turn RoPE at base 10,000 and without the file's scaling.
GEMMA3_SWA_PATTERN = 6
GEMMA3_LOCAL_ROPE_BASE = 10000.0


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
    attn_scale: float  # multiplies q.k: 1 / sqrt(head_dim), as llama.cpp sets it for every model here
    # Gemma 3 only (the defaults are llama's): a window on the local layers, their RoPE base,
    # the global layers' linear RoPE factor, the MLP's activation, the embedding's scale.
    sliding_window: int = 0  # 0: every layer attends to every earlier position
    swa_pattern: int = 0  # every swa_pattern-th layer is global, the others local
    rope_base_local: float = 0.0
    rope_linear_factor: float = 1.0
    mlp_act: Literal["silu", "gelu_tanh"] = "silu"
    embed_scale: float | None = None

    def window(self, layer: int) -> int:
        """The sliding window of `layer` (0: none)."""
        if self.swa_pattern and (layer + 1) % self.swa_pattern != 0:
            return self.sliding_window
        return 0


@dataclass
class ModelFile:
    path: Path
    spec: ModelSpec
    metadata: dict[str, Any]
    # name -> float32 array (or RawTensor when kept quantized); layer tensors are keyed
    # "layers.N.<name>".
    tensors: dict[str, np.ndarray | RawTensor]

    def drop_resident_pages(self) -> None:
        """The file's pages leave the resident set (the loader calls this as it copies the
        weights out, so the file and its copy are never both resident)."""
        for value in self.tensors.values():
            if isinstance(value, RawTensor):  # a view of the mapping (float arrays are copies)
                drop_mapped_file_pages(value.data)
                return


def _read(path: Path) -> tuple[dict[str, Any], list[TensorEntry]]:
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file")
    if not path.is_file():
        raise ModelLoadError(f"{path}: not a regular file")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"{path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    try:
        return read_gguf(path)
    except GGUFFormatError as e:
        raise ModelLoadError(f"{path}: truncated or corrupt GGUF file ({e})") from None


def _named(entries: list[TensorEntry], path: Path) -> dict[str, TensorEntry]:
    """The tensors the model uses, by our name (a name the file gives twice is refused)."""
    named: dict[str, TensorEntry] = {}
    seen: set[str] = set()
    for entry in entries:
        if entry.name in seen:
            raise ModelLoadError(f"{path}: tensor {entry.name!r} appears twice")
        seen.add(entry.name)
        if (name := our_name(entry.name)) is not None:
            named[name] = entry
    return named


def _arch(meta: dict[str, Any], path: Path) -> str:
    arch = meta.get("general.architecture")
    if arch not in ROPE_STYLES:
        raise ModelLoadError(
            f"{path}: architecture {shown(arch)} is not supported (supported: {', '.join(ROPE_STYLES)})"
        )
    return arch


def _spec(meta: dict[str, Any], entries: dict[str, TensorEntry], path: Path) -> ModelSpec:
    """The hyperparameters, each of a type and in a range the kernels can take (validate.py)."""
    arch, keys = _arch(meta, path), Metadata(meta, path)
    if "embed" not in entries:
        raise ModelLoadError(f"{path}: tensor 'token_embd.weight' is missing")
    dim, num_heads = keys.int(f"{arch}.embedding_length"), keys.int(f"{arch}.attention.head_count")
    head_dim = head_size(keys, arch, dim, num_heads)
    num_layers = keys.int(f"{arch}.block_count")
    extra = _gemma3_spec(keys, dim, num_heads, head_dim, num_layers) if arch == "gemma3" else {
        "attn_scale": 1.0 / math.sqrt(head_dim)}
    return ModelSpec(
        arch=arch,
        num_layers=num_layers,
        dim=dim,
        ffn_dim=keys.int(f"{arch}.feed_forward_length"),
        num_heads=num_heads,
        num_kv_heads=keys.int(f"{arch}.attention.head_count_kv", num_heads),
        head_dim=head_dim,
        vocab_size=int(entries["embed"].shape[0]),
        context_len=keys.int(f"{arch}.context_length"),
        rope_base=keys.float(f"{arch}.rope.freq_base", 10000.0),
        rope_dim=keys.int(f"{arch}.rope.dimension_count", head_dim),
        rope_style=ROPE_STYLES[arch],
        norm_eps=keys.float(f"{arch}.attention.layer_norm_rms_epsilon", is_positive=False),
        **extra,
    )


def _gemma3_spec(keys: Metadata, dim: int, num_heads: int, head_dim: int, num_layers: int) -> dict[str, Any]:
    """What Gemma 3 adds, as llama.cpp reads it (llama-model.cpp, LLM_ARCH_GEMMA3)."""
    scaling = keys.meta.get("gemma3.rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise keys.fail(f"gemma3.rope.scaling.type {shown(scaling)} is not supported (none, linear)")
    # The 27B model scales by dim / heads (its query_pre_attn_scalar); the others by head_dim.
    scalar = dim // num_heads if num_layers == 62 else head_dim
    return {
        "attn_scale": 1.0 / math.sqrt(scalar),
        "sliding_window": keys.int("gemma3.attention.sliding_window", 0, minimum=0),
        "swa_pattern": GEMMA3_SWA_PATTERN,
        "rope_base_local": keys.float("gemma3.rope.freq_base_swa", GEMMA3_LOCAL_ROPE_BASE),
        "rope_linear_factor": keys.float("gemma3.rope.scaling.factor", 1.0) if scaling == "linear" else 1.0,
        "mlp_act": "gelu_tanh",
        "embed_scale": math.sqrt(dim),
    }


def _checked(meta: dict[str, Any], entries: list[TensorEntry], path: Path) -> tuple[ModelSpec, dict[str, TensorEntry]]:
    """The spec and the tensors it uses, once metadata, tensor shapes and token ids all agree
    (validate.py): nothing reaches the kernels before this."""
    named = _named(entries, path)
    spec, keys = _spec(meta, named, path), Metadata(meta, path)
    check_heads(spec, keys)
    check_tensors(spec, named, keys)
    check_vocabulary(meta, spec.vocab_size, keys)
    return spec, named


def _dequantize(tensor: TensorEntry, path: Path) -> np.ndarray:
    import gguf.quants

    try:
        values = gguf.quants.dequantize(tensor.data, gguf.GGMLQuantizationType(tensor.qtype))
    except (NotImplementedError, KeyError, ValueError, TypeError) as e:
        raise ModelLoadError(
            f"{path}: tensor {tensor.name!r} has type {tensor.type_name}, which we cannot read ({e})"
        ) from None
    values = np.ascontiguousarray(values.reshape(tensor.shape), dtype=np.float32)
    # F32 tensors come back as read-only views of the mapped file; torch wants its own copy.
    return values if values.flags.writeable else values.copy()


def _raw(tensor: TensorEntry, path: Path, runs_natively: Callable[[int], bool]) -> RawTensor:
    if not runs_natively(tensor.qtype):
        raise ModelLoadError(f"{path}: tensor {tensor.name!r} has type {tensor.type_name}, which the native "
                             "kernels do not run; --weights float32 runs it dequantized")
    return RawTensor(tensor.data.view(np.uint8).reshape(tensor.shape[0], -1), tensor.qtype, tensor.shape)


def read_model_header(path: Path) -> tuple[dict[str, Any], int]:
    """The metadata and the context length, without reading a tensor's data (a fleet's
    ingress tokenizes from this alone), after the same checks as a full read."""
    path = Path(path)
    meta, entries = _read(path)
    spec, _ = _checked(meta, entries, path)
    return meta, spec.context_len


def read_model_file(path: Path, runs_natively: Callable[[int], bool] | None = None) -> ModelFile:
    """runs_natively: keep the matmul weights whose type it accepts as RawTensor blocks
    (any other type is refused, naming the tensor); None dequantizes everything."""
    path = Path(path)
    meta, entries = _read(path)
    spec, named = _checked(meta, entries, path)
    tensors: dict[str, np.ndarray | RawTensor] = {}
    for name, entry in named.items():
        is_float32 = entry.qtype == 0  # F32 blocks are float32 already: a plain array
        if runs_natively is not None and name.rsplit(".", 1)[-1] in MATMUL_WEIGHTS and not is_float32:
            tensors[name] = _raw(entry, path, runs_natively)
        else:
            tensors[name] = _dequantize(entry, path)
    return ModelFile(path=path, spec=spec, metadata=meta, tensors=tensors)
