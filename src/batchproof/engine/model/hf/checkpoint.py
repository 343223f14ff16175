"""Reading a Hugging Face checkpoint directory (config.json + safetensors) into the ModelFile
that llama.cpp's converter and our GGUF reader would make of the same weights.

So that a checkpoint and its GGUF give the same bits, the weights are laid out as the
converter lays them out: llama's Q/K rows permuted for adjacent-pair RoPE (qwen and gemma
keep Hugging Face's halves), Gemma's norm weights stored as 1 + w (Hugging Face multiplies
by 1 + w; the sum is formed in float32, as its Gemma3RMSNorm forms it). Matmul weights in
BF16 or F16 stay in their dtype, as a GGUF's would (our kernels multiply them natively);
F32 tensors, norms and biases become float32 arrays. The safetensors files are memory
mapped; every tensor is copied out of the mapping, so a trainer that rewrites the files
later cannot change (or truncate) what is being served.
"""

import hashlib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from batchproof.common.hashing import file_sha256
from batchproof.engine.memory import drop_pages
from batchproof.engine.model.errors import ModelLoadError
from batchproof.engine.model.hf.config import architecture, hf_spec, is_tied, read_config
from batchproof.engine.model.hf.names import IGNORED_SUFFIXES, hf_name, our_name
from batchproof.engine.model.spec import (
    GLOBAL_SHAPES,
    LAYER_SHAPES,
    MATMUL_WEIGHTS,
    TOGETHER,
    ModelFile,
    ModelSpec,
    layer_tensors,
)
from batchproof.engine.model.weights import RawTensor

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
GGML_TYPES = {"F32": 0, "F16": 1, "BF16": 30}  # safetensors dtype -> the GGML type our kernels know it as
GEMMA_NORMS = {"attn_norm", "ffn_norm", "post_attn_norm", "post_ffn_norm", "q_norm", "k_norm", "final_norm"}


@dataclass(frozen=True)
class StoredTensor:
    """A tensor in one of the checkpoint's files, not yet read."""

    name: str  # the checkpoint's name
    dtype: str  # safetensors' spelling: F32, BF16...
    shape: tuple[int, ...]
    file: Path
    handle: Any  # the open safe_open of `file`

    def mapped(self) -> torch.Tensor:
        """The tensor as a view of the file's private memory map (no copy)."""
        return self.handle.get_tensor(self.name)


@dataclass
class CheckpointFile(ModelFile):
    mapped: list[torch.Tensor] = field(default_factory=list)  # views of the file maps, to drop their pages

    def drop_resident_pages(self) -> None:
        # The maps are private and never written: dropped pages read back from the file.
        for t in self.mapped:
            drop_pages(t.data_ptr(), t.nbytes)


@dataclass(frozen=True)
class Checkpoint:
    """A directory whose config, file list and tensor shapes all agree (nothing converted yet)."""

    path: Path
    config: dict[str, Any]
    spec: ModelSpec
    rope_freqs: np.ndarray | None
    tensors: dict[str, StoredTensor]  # our name -> where it is
    files: list[Path]


def safetensors_files(directory: Path) -> list[Path]:
    """model.safetensors, or the shards model.safetensors.index.json names (each must exist)."""
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise ModelLoadError(f"{index}: not a safetensors index (a JSON object with a 'weight_map': {e})") from None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ModelLoadError(f"{index}: 'weight_map' is not an object of file names")
        names = sorted(set(weight_map.values()))
        for name in names:
            if Path(name).name != name or not (directory / name).is_file():
                raise ModelLoadError(f"{index}: names {name!r}, which is not a file in {directory}")
        return [directory / name for name in names]
    if (directory / SINGLE_FILE).is_file():
        return [directory / SINGLE_FILE]
    if any(directory.glob("*.bin")):
        raise ModelLoadError(f"{directory}: holds only .bin weights (pickles); we read {SINGLE_FILE} or {INDEX_FILE}")
    raise ModelLoadError(f"{directory}: no {SINGLE_FILE} nor {INDEX_FILE}")


def _stored(files: list[Path], arch: str, is_tied_head: bool) -> dict[str, StoredTensor]:
    """Every tensor of every file, by our name: a name twice, or one the model would not use,
    is refused (a bias or norm left unread would change the answers silently)."""
    found: dict[str, StoredTensor] = {}
    seen: set[str] = set()
    for file in files:
        try:
            handle = safe_open(file, framework="pt")
            names = list(handle.keys())
            slices = {name: handle.get_slice(name) for name in names}
        except (SafetensorError, OSError, ValueError) as e:
            raise ModelLoadError(f"{file}: not a readable safetensors file ({e})") from None
        for name in names:
            if name in seen:
                raise ModelLoadError(f"{file}: tensor {name!r} appears twice in the checkpoint")
            seen.add(name)
            if name.endswith(IGNORED_SUFFIXES) or (name == "lm_head.weight" and is_tied_head):
                continue  # tied: Hugging Face multiplies by the embedding, whatever lm_head holds
            ours = our_name(arch, name)
            if ours is None:
                raise ModelLoadError(f"{file}: tensor {name!r} is not part of a {arch} model we serve")
            found[ours] = StoredTensor(name, slices[name].get_dtype(), tuple(slices[name].get_shape()), file, handle)
    return found


def _sizes(spec: ModelSpec) -> dict[str, tuple[int, str]]:
    """size name -> (its value, where config.json says it), for spec.py's shape table."""
    return {
        "dim": (spec.dim, "hidden_size"), "ffn_dim": (spec.ffn_dim, "intermediate_size"),
        "q_dim": (spec.num_heads * spec.head_dim, f"num_attention_heads x head size {spec.head_dim}"),
        "kv_dim": (spec.num_kv_heads * spec.head_dim, f"num_key_value_heads x head size {spec.head_dim}"),
        "head_dim": (spec.head_dim, "the head size"), "vocab": (spec.vocab_size, "vocab_size"),
        "rope_pairs": (spec.rope_dim // 2, "the head size / 2"),
        "experts": (spec.num_experts, "the expert count"), "expert_ffn": (spec.expert_ffn_dim, "an expert's MLP size"),
    }


def _check_tensors(spec: ModelSpec, stored: dict[str, StoredTensor], directory: Path, is_tied_head: bool) -> None:
    """Each tensor the architecture needs is there, in a dtype we read, of the shape config.json implies."""
    wanted = {name: name != "lm_head" or not is_tied_head for name in ("embed", "final_norm", "lm_head")}
    _check_expert_count(spec, stored, directory)
    for i in range(min(spec.num_layers, len(stored) + 1)):  # past len(stored) one is missing anyway
        required, optional = layer_tensors(spec, i, is_stacked=False)
        wanted |= {f"layers.{i}.{short}": short in required for short in required + optional}
    for name, is_required in wanted.items():
        if is_required and name not in stored:
            raise ModelLoadError(f"{directory}: tensor {hf_name(spec.arch, name)!r} is missing (in no safetensors "
                                 "file)")
    sizes = _sizes(spec)
    for name, tensor in stored.items():
        if name not in wanted:
            raise ModelLoadError(f"{tensor.file}: tensor {tensor.name!r} is not part of a {spec.arch} model with "
                                 f"num_hidden_layers = {spec.num_layers}")
        if tensor.dtype not in GGML_TYPES:
            raise ModelLoadError(f"{tensor.file}: tensor {tensor.name!r} has dtype {tensor.dtype}; we read "
                                 f"{', '.join(GGML_TYPES)}")
        dims = (GLOBAL_SHAPES | LAYER_SHAPES)[name.rsplit(".", 1)[-1]]
        want = tuple(sizes[d][0] for d in dims)
        if tensor.shape != want:
            said = ", ".join(f"{sizes[d][1]} = {sizes[d][0]}" for d in dict.fromkeys(dims))
            raise ModelLoadError(f"{tensor.file}: tensor {tensor.name!r} has shape {list(tensor.shape)}, but "
                                 f"config.json makes it {list(want)} ({said})")
    for i in range(spec.num_layers):
        present = [short for short in TOGETHER if f"layers.{i}.{short}" in stored]
        if present and len(present) < len(TOGETHER):
            missing = next(short for short in TOGETHER if short not in present)
            raise ModelLoadError(f"{directory}: tensor {hf_name(spec.arch, f'layers.{i}.{missing}')!r} is missing "
                                 "(the QKV biases come together)")


def _check_expert_count(spec: ModelSpec, stored: dict[str, StoredTensor], directory: Path) -> None:
    """An MoE layer needs 3 tensors an expert: a config claiming more experts than the files could
    hold is refused naming the last one's tensor, before a name is listed per expert (a crafted
    count of 2**40 would otherwise fill the memory with names)."""
    first_moe = next((i for i in range(spec.num_layers) if spec.is_moe_layer(i)), None)
    if first_moe is not None and 3 * spec.num_experts > len(stored):
        name = hf_name(spec.arch, f"layers.{first_moe}.experts.{spec.num_experts - 1}.w_gate_exp")
        raise ModelLoadError(f"{directory}: tensor {name!r} is missing (in no safetensors file)")


def inspect_checkpoint(directory: Path) -> Checkpoint:
    """Everything but the tensors' data, checked (a fleet's ingress and load_weights stop here
    to refuse early)."""
    directory = Path(directory)
    config_path = directory / CONFIG_FILE
    config = read_config(config_path)
    arch = architecture(config, config_path)
    tied = is_tied(config, arch, config_path)
    files = safetensors_files(directory)
    stored = _stored(files, arch, tied)
    if "embed" not in stored:
        raise ModelLoadError(f"{directory}: tensor 'model.embed_tokens.weight' is missing (in no safetensors file)")
    spec, rope_freqs = hf_spec(config, arch, config_path, stored["embed"].shape[0])
    _check_tensors(spec, stored, directory, tied)
    return Checkpoint(directory, config, spec, rope_freqs, stored, files)


def _rope_rows(spec: ModelSpec, short: str) -> np.ndarray | None:
    """llama.cpp's converter order for llama's Q/K rows (and biases): within each head, the
    two halves interleaved, so RoPE's pairs sit side by side; None for every other tensor."""
    if spec.rope_style != "adjacent" or short not in ("wq", "bq", "wk", "bk"):
        return None
    num_heads = spec.num_heads if short in ("wq", "bq") else spec.num_kv_heads
    half = spec.head_dim // 2
    return np.arange(num_heads * spec.head_dim).reshape(num_heads, 2, half).swapaxes(1, 2).reshape(-1)


def _convert(spec: ModelSpec, name: str, t: torch.Tensor, dtype: str,
             runs_natively: Callable[[int], bool] | None) -> np.ndarray | RawTensor:
    short = name.rsplit(".", 1)[-1]
    rows = _rope_rows(spec, short)
    qtype = GGML_TYPES[dtype]
    if runs_natively is not None and short in MATMUL_WEIGHTS and qtype != 0 and runs_natively(qtype):
        data = t.view(torch.uint8).numpy()  # [rows, K * 2], still the mapping: quant_weight copies it out
        return RawTensor(data if rows is None else data[rows], qtype, tuple(t.shape))
    values = t.numpy().copy() if t.dtype == torch.float32 else t.float().numpy()  # own memory either way
    if spec.arch == "gemma3" and short in GEMMA_NORMS:
        values = np.float32(1.0) + values
    return np.ascontiguousarray(values if rows is None else values[rows], dtype=np.float32)


def read_checkpoint(directory: Path, runs_natively: Callable[[int], bool] | None = None) -> CheckpointFile:
    """As gguf/file.py's read_model_file: runs_natively keeps the BF16/F16 matmul weights in their dtype
    (RawTensor); None makes everything float32 (--weights float32, the torch backend)."""
    checkpoint = inspect_checkpoint(directory)
    tensors: dict[str, np.ndarray | RawTensor] = {}
    mapped = []
    for name, stored in checkpoint.tensors.items():
        t = stored.mapped()
        mapped.append(t)
        tensors[name] = _convert(checkpoint.spec, name, t, stored.dtype, runs_natively)
    if checkpoint.rope_freqs is not None:
        tensors["rope_freqs"] = checkpoint.rope_freqs
    return CheckpointFile(path=checkpoint.path, spec=checkpoint.spec, metadata=checkpoint.config, tensors=tensors,
                          mapped=mapped)


def checkpoint_sha256(directory: Path) -> str:
    """The checkpoint's identity: sha256 over config.json's and each safetensors file's name and
    sha256 (their contents, hashed in parallel: ~0.6 s a GB a core), so any change to a weight
    gives another id. Never cached by size and mtime: a trainer rewrites a shard in place with
    the same size, within one tick of the file system's clock."""
    directory = Path(directory)
    paths = [directory / CONFIG_FILE, *safetensors_files(directory)]
    with ThreadPoolExecutor(max_workers=min(4, len(paths))) as pool:
        digests = list(pool.map(file_sha256, paths))
    return checkpoint_identity(paths, digests)


def checkpoint_identity(paths: list[Path], digests: list[str]) -> str:
    """sha256 over each file's name and sha256: what checkpoint_sha256 and a load that hashed the
    files itself (source.pinned_files) both call the checkpoint."""
    lines = "".join(f"{path.name}\0{d}\n" for path, d in zip(paths, digests))
    return hashlib.sha256(lines.encode()).hexdigest()
