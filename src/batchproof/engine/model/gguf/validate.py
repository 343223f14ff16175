"""Refusing a GGUF file whose metadata and tensors disagree, before a byte of it reaches the kernels.

The C kernels trust the sizes they are given (the RoPE width, the hidden and MLP sizes, a
weight's rows, a token id): a file whose metadata disagrees with its tensors would make them
read or write past their buffers (measured: `rope.dimension_count` = 4096 on a 64-wide head
overwrote the heap). So every hyperparameter is range-checked, every tensor the model uses
must have exactly the shape the metadata implies, and every token id must be a row of the
embedding and the LM head; a file that fails is refused with one line naming the key or the
tensor.
"""

from typing import Any

from batchproof.engine.model.errors import Metadata, shown
from batchproof.engine.model.gguf.names import gguf_name
from batchproof.engine.model.gguf.reader import TensorEntry
from batchproof.engine.model.spec import GLOBAL_SHAPES, LAYER_SHAPES, TOGETHER, ModelSpec, layer_tensors


def head_size(keys: Metadata, arch: str, dim: int, num_heads: int) -> int:
    """The file's key_length, else the embedding split over the heads (which must leave some)."""
    key = f"{arch}.attention.key_length"
    if key in keys.meta:
        return keys.int(key)
    if dim < num_heads:
        raise keys.fail(f"{arch}.embedding_length {dim} is smaller than {arch}.attention.head_count {num_heads}")
    return dim // num_heads


def check_heads(spec: ModelSpec, keys: Metadata) -> None:
    """What the attention and RoPE kernels index by: the heads grouped evenly over the KV
    heads, the RoPE pairs inside the head."""
    arch = spec.arch
    if spec.num_heads % spec.num_kv_heads:
        raise keys.fail(f"{arch}.attention.head_count {spec.num_heads} is not a multiple of "
                        f"{arch}.attention.head_count_kv {spec.num_kv_heads}")
    value_key = f"{arch}.attention.value_length"
    if value_key in keys.meta and keys.int(value_key) != spec.head_dim:  # one head size serves K and V
        raise keys.fail(f"{value_key} {keys.meta[value_key]} differs from the key head size {spec.head_dim} "
                        "(not supported)")
    if spec.rope_dim > spec.head_dim or spec.rope_dim % 2:
        raise keys.fail(f"{arch}.rope.dimension_count {spec.rope_dim} must be even and at most the head size "
                        f"{spec.head_dim}")


def _sizes(spec: ModelSpec) -> dict[str, tuple[int, str]]:
    """size name -> (its value, where the metadata says it) for spec.py's shapes."""
    a, hd = spec.arch, spec.head_dim
    return {
        "dim": (spec.dim, f"{a}.embedding_length"),
        "ffn_dim": (spec.ffn_dim, f"{a}.feed_forward_length"),
        "q_dim": (spec.num_heads * hd, f"{a}.attention.head_count x head size {hd}"),
        "kv_dim": (spec.num_kv_heads * hd, f"{a}.attention.head_count_kv x head size {hd}"),
        "head_dim": (hd, "the head size"),
        "vocab": (spec.vocab_size, "token_embd.weight's rows"),
        "rope_pairs": (spec.rope_dim // 2, f"{a}.rope.dimension_count / 2"),
        "experts": (spec.num_experts, f"{a}.expert_count"),
        "expert_ffn": (spec.expert_ffn_dim, f"{a}.expert_feed_forward_length"),
    }


def _gguf_order(shape: tuple[int, ...]) -> list[int]:
    """As the file and gguf's own tools write a shape: fastest dimension first."""
    return list(reversed(shape))


def check_tensors(spec: ModelSpec, entries: dict[str, TensorEntry], keys: Metadata) -> None:
    """Every tensor the model needs is there, none it would ignore is, and each has the shape
    the metadata implies."""
    expected = _expected_tensors(spec, num_layers=min(spec.num_layers, len(entries) + 1))
    for name, (_, is_required) in expected.items():
        if is_required and name not in entries:
            raise keys.fail(f"tensor {gguf_name(name)!r} is missing")
    sizes = _sizes(spec)
    for name, entry in entries.items():
        if name not in expected:
            raise keys.fail(f"tensor {entry.name!r} is not part of a {spec.arch} model with "
                            f"{spec.arch}.block_count = {spec.num_layers}")
        _check_shape(entry, expected[name][0], sizes, keys)
    for i in range(spec.num_layers):  # at most len(entries): every layer passed the check above
        present = [short for short in TOGETHER if f"layers.{i}.{short}" in entries]
        if present and len(present) < len(TOGETHER):
            missing = next(short for short in TOGETHER if short not in present)
            name = gguf_name(f"layers.{i}.{missing}")
            raise keys.fail(f"tensor {name!r} is missing (the QKV biases come together)")


def _expected_tensors(spec: ModelSpec, num_layers: int) -> dict[str, tuple[tuple[str, ...], bool]]:
    """our name -> (its shape in sizes, whether it is required). Past len(entries) layers some
    tensor must be missing, so the caller stops there: a crafted block_count of 2**60 is
    refused at once instead of listing every name."""
    expected = {name: (GLOBAL_SHAPES[name], name in ("embed", "final_norm")) for name in GLOBAL_SHAPES}
    for i in range(num_layers):
        required, optional = layer_tensors(spec, i, is_stacked=True)
        expected |= {f"layers.{i}.{short}": (LAYER_SHAPES[short], short in required) for short in required + optional}
    return expected


def _check_shape(entry: TensorEntry, dims: tuple[str, ...], sizes: dict[str, tuple[int, str]],
                 keys: Metadata) -> None:
    want = tuple(sizes[d][0] for d in dims)
    if entry.shape == want:
        return
    said = ", ".join(f"{sizes[d][1]} = {sizes[d][0]}" for d in dict.fromkeys(dims))
    raise keys.fail(f"tensor {entry.name!r} has shape {_gguf_order(entry.shape)}, but the metadata makes it "
                    f"{_gguf_order(want)} ({said})")


# tokenizer arrays -> (the types of their items, named; whether they hold one entry per token)
TOKEN_ARRAYS: dict[str, tuple[tuple[type, ...], str, bool]] = {
    "tokenizer.ggml.tokens": ((str,), "strings", True),
    "tokenizer.ggml.token_type": ((int,), "integers", True),
    "tokenizer.ggml.scores": ((int, float), "numbers", True),
    "tokenizer.ggml.merges": ((str,), "strings", False),
}


def check_vocabulary(meta: dict[str, Any], num_rows: int, keys: Metadata) -> None:
    """One token per row of the embedding (and so of the LM head, whose shape is checked
    against it), and every id the metadata names is one of those rows: the embedding lookup
    reads row `id` unchecked."""
    if "tokenizer.ggml.tokens" not in meta:
        raise keys.fail("metadata key 'tokenizer.ggml.tokens' is missing")
    for key, (kinds, kinds_name, is_per_token) in TOKEN_ARRAYS.items():
        values = meta.get(key)
        if values is None:
            continue
        if not isinstance(values, list) or not all(isinstance(v, kinds) for v in values):
            raise keys.fail(f"metadata key {key!r} is not a list of {kinds_name}")
        if is_per_token and len(values) != num_rows:
            raise keys.fail(f"{key} has {len(values)} entries but token_embd.weight has {num_rows} rows")
    _check_merges(meta, keys)
    for key, value in meta.items():
        if key.startswith("tokenizer.ggml.") and key.endswith("_token_id"):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < num_rows:
                raise keys.fail(f"metadata key {key!r} is {shown(value)}, not a token id "
                                f"(0..{num_rows - 1}: the rows of token_embd.weight)")


def _check_merges(meta: dict[str, Any], keys: Metadata) -> None:
    """Each merge is two tokens whose join is a token, as the BPE library demands (it would
    raise a bare Exception or a TypeError of its own, not a line naming the key). Only the
    byte-level BPE vocabulary reads them; 30 ms for SmolLM2's 48,900."""
    if meta.get("tokenizer.ggml.model") != "gpt2":
        return
    vocabulary = set(meta["tokenizer.ggml.tokens"])
    for i, merge in enumerate(meta.get("tokenizer.ggml.merges", [])):
        left, space, right = merge.partition(" ")
        if not space or left not in vocabulary or right not in vocabulary or left + right not in vocabulary:
            raise keys.fail(f"tokenizer.ggml.merges[{i}] {shown(merge)} is not two tokens whose join is a token")
