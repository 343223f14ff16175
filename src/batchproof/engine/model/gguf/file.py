"""Reading a GGUF file: hyperparameters, tokenizer metadata, and tensors (dequantized, or
the matmul weights kept in their blocks for the native kernels)."""

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from batchproof.engine.model.errors import Metadata, ModelLoadError, shown
from batchproof.engine.model.gguf.moe_keys import moe_fields
from batchproof.engine.model.gguf.names import UNSUPPORTED_MOE_TENSORS, our_name
from batchproof.engine.model.gguf.reader import GGUFFormatError, TensorEntry, read_gguf
from batchproof.engine.model.gguf.validate import check_heads, check_tensors, check_vocabulary, head_size
from batchproof.engine.model.spec import (
    EXPERT_WEIGHTS,
    GEMMA3_LOCAL_ROPE_BASE,
    GEMMA3_SWA_PATTERN,
    MATMUL_WEIGHTS,
    ROPE_STYLES,
    ModelFile,
    ModelSpec,
)
from batchproof.engine.model.weights import RawTensor

GGUF_MAGIC = b"GGUF"


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


def _named(entries: list[TensorEntry], arch: str, path: Path) -> dict[str, TensorEntry]:
    """The tensors the model uses, by our name (a name the file gives twice is refused, and so
    is a tensor of an MoE variant we do not run)."""
    named: dict[str, TensorEntry] = {}
    seen: set[str] = set()
    for entry in entries:
        if entry.name in seen:
            raise ModelLoadError(f"{path}: tensor {entry.name!r} appears twice")
        seen.add(entry.name)
        for mark, what in UNSUPPORTED_MOE_TENSORS.items():
            if mark in entry.name:
                raise ModelLoadError(f"{path}: tensor {entry.name!r} holds {what}, which batchproof does not run")
        if (name := our_name(entry.name, arch)) is not None:
            named[name] = entry
    return named


# The architectures a GGUF names (a Mixtral is `llama` with llama.expert_count; mixtral is ours).
GGUF_ARCHS = tuple(arch for arch in ROPE_STYLES if arch != "mixtral")


def _arch(meta: dict[str, Any], path: Path) -> str:
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHS:
        raise ModelLoadError(
            f"{path}: architecture {shown(arch)} is not supported (supported: {', '.join(GGUF_ARCHS)})"
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
    ffn_dim = keys.int(f"{arch}.feed_forward_length")
    moe = moe_fields(keys, arch, ffn_dim, num_layers, entries)
    return ModelSpec(
        arch="mixtral" if arch == "llama" and moe else arch,
        num_layers=num_layers,
        dim=dim,
        ffn_dim=ffn_dim,
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
        **moe,
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
    named = _named(entries, _arch(meta, path), path)
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


STACKED_EXPERTS = {w + "s": w for w in EXPERT_WEIGHTS}  # "w_gate_exps" -> each expert's "w_gate_exp"


def _experts(name: str, entry: TensorEntry, path: Path,
             runs_natively: Callable[[int], bool] | None) -> dict[str, np.ndarray | RawTensor]:
    """A stacked [experts, rows, K] tensor as one [rows, K] tensor per expert ("layers.N.w_up_exps"
    -> "layers.N.experts.E.w_up_exp"): each expert's rows, kept in their blocks (views of the
    mapping, copied out at load as any weight is) or dequantized."""
    layer, short = name.rsplit(".", 1)
    num_experts, rows, k = entry.shape
    if runs_natively is not None and entry.qtype != 0:
        if not runs_natively(entry.qtype):
            raise ModelLoadError(f"{path}: tensor {entry.name!r} has type {entry.type_name}, which the native "
                                 "kernels do not run; --weights float32 runs it dequantized")
        blocks = entry.data.view(np.uint8).reshape(num_experts, rows, -1)
        parts: list = [RawTensor(blocks[e], entry.qtype, (rows, k)) for e in range(num_experts)]
    else:
        parts = list(_dequantize(entry, path))
    return {f"{layer}.experts.{e}.{STACKED_EXPERTS[short]}": part for e, part in enumerate(parts)}


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
        if name.rsplit(".", 1)[-1] in STACKED_EXPERTS:
            tensors |= _experts(name, entry, path, runs_natively)
        elif runs_natively is not None and name.rsplit(".", 1)[-1] in MATMUL_WEIGHTS and not is_float32:
            tensors[name] = _raw(entry, path, runs_natively)
        else:
            tensors[name] = _dequantize(entry, path)
    return ModelFile(path=path, spec=spec, metadata=meta, tensors=tensors)
