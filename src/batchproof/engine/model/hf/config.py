"""A Hugging Face config.json read into the ModelSpec a GGUF of the same model would give.

Every value is typed and range-checked as a GGUF's metadata is (errors.Metadata), and a
setting the forward pass does not implement (an activation, a RoPE scaling, soft-capping,
a sliding window on a qwen) is refused with one line rather than silently ignored.
Both spellings transformers has written are read: v5's `rope_parameters` (per layer type
for Gemma 3) and v4's `rope_theta` / `rope_scaling` / `rope_local_base_freq`.
"""

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from batchproof.engine.model.errors import Metadata, ModelLoadError, shown
from batchproof.engine.model.hf.moe_config import moe_fields
from batchproof.engine.model.spec import GEMMA3_LOCAL_ROPE_BASE, GEMMA3_SWA_PATTERN, ROPE_STYLES, ModelSpec

# config.json's model_type -> our architecture (Gemma 3's text-only checkpoints say gemma3_text).
MODEL_TYPES: dict[str, str] = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3",
                               "qwen3_moe": "qwen3moe", "olmoe": "olmoe", "mixtral": "mixtral"}
ACTIVATIONS: dict[str, tuple[str, str]] = {  # arch -> (the key, the one value our kernels run)
    "llama": ("hidden_act", "silu"), "qwen2": ("hidden_act", "silu"), "qwen3": ("hidden_act", "silu"),
    "gemma3": ("hidden_activation", "gelu_pytorch_tanh"),
    "qwen3moe": ("hidden_act", "silu"), "olmoe": ("hidden_act", "silu"), "mixtral": ("hidden_act", "silu"),
}
# Keys whose other values would change the arithmetic in a way we do not implement: value we require.
MUST_BE: dict[str, Any] = {
    "mlp_bias": False, "use_sliding_window": False, "attn_logit_softcapping": None,
    "final_logit_softcapping": None, "use_bidirectional_attention": False, "partial_rotary_factor": 1.0,
}
TIED_BY_DEFAULT = {"gemma3"}  # tie_word_embeddings when config.json does not say (transformers' defaults)


class ConfigKeys(Metadata):
    kind = "key"


def json_object(path: Path) -> dict[str, Any]:
    """A JSON object file as a dict (one line naming the file if it is not one)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path}: not a JSON file ({e})") from None
    if not isinstance(value, dict):
        raise ModelLoadError(f"{path}: holds {type(value).__name__}, not a JSON object")
    return value


def read_config(path: Path) -> dict[str, Any]:
    """config.json as a dict (one line naming the file if it is missing or not a JSON object)."""
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file (a Hugging Face checkpoint directory needs config.json)")
    return json_object(path)


def architecture(config: dict[str, Any], path: Path) -> str:
    model_type = config.get("model_type")
    if model_type not in MODEL_TYPES:
        hint = " (a multimodal Gemma 3: serve its text-only checkpoint)" if model_type == "gemma3" else ""
        raise ModelLoadError(f"{path}: model_type {shown(model_type)} is not supported{hint} "
                             f"(supported: {', '.join(MODEL_TYPES)})")
    if config.get("quantization_config") is not None:
        method = config["quantization_config"].get("quant_method") if isinstance(config["quantization_config"],
                                                                                 dict) else None
        raise ModelLoadError(f"{path}: quantization_config ({shown(method)}) is not supported: we serve F32, BF16 "
                             "and F16 weights")
    return MODEL_TYPES[model_type]


def is_tied(config: dict[str, Any], arch: str, path: Path) -> bool:
    tied = config.get("tie_word_embeddings", arch in TIED_BY_DEFAULT)
    if not isinstance(tied, bool):
        raise ModelLoadError(f"{path}: key 'tie_word_embeddings' is {shown(tied)}, not true or false")
    return tied


def _check_supported(config: dict[str, Any], arch: str, keys: ConfigKeys) -> None:
    act_key, act = ACTIVATIONS[arch]
    if config.get(act_key, act) != act:
        raise keys.fail(f"key {act_key!r} is {shown(config[act_key])}; a {arch} model here runs {act!r} only")
    for key, required in MUST_BE.items():
        if key in config and config[key] != required:
            raise keys.fail(f"key {key!r} is {shown(config[key])}; only {json.dumps(required)} is supported")


def _rope_params(config: dict[str, Any], layer_type: str | None) -> dict[str, Any]:
    """{rope_theta, rope_type, factor...} for the global layers (or `layer_type`'s, Gemma 3)."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and layer_type in params:  # v5 Gemma 3: one entry per layer type
        params = params[layer_type]
    if isinstance(params, dict) and params:
        return params
    params = dict(config.get("rope_scaling") or {})  # v4
    if "rope_theta" in config:
        params["rope_theta"] = config["rope_theta"]
    return params


def _rope(config: dict[str, Any], arch: str, keys: ConfigKeys, head_dim: int) -> dict[str, Any]:
    """The spec's RoPE fields, and Llama 3's per-frequency factors (the GGUF's rope_freqs)."""
    params = _rope_params(config, "full_attention")
    where = ConfigKeys(params, keys.path)
    where.kind = "RoPE key"
    base = where.float("rope_theta", 10000.0)
    kind = params.get("rope_type", params.get("type", "default"))
    out: dict[str, Any] = {"rope_base": base, "rope_linear_factor": 1.0, "rope_freqs": None}
    if kind == "linear":
        out["rope_linear_factor"] = where.float("factor")
    elif kind == "llama3" and arch == "llama":
        out["rope_freqs"] = llama3_rope_factors(where, base, head_dim)
    elif kind != "default":
        raise keys.fail(f"RoPE type {shown(kind)} is not supported (default, linear; llama3 for llama)")
    if arch == "gemma3":
        local = _rope_params(config, "sliding_attention")
        if "rope_local_base_freq" in config:  # v4
            local = {"rope_theta": config["rope_local_base_freq"]}
        local_keys = ConfigKeys(local, keys.path)
        local_keys.kind = "RoPE key (sliding layers)"
        out["rope_base_local"] = local_keys.float("rope_theta", GEMMA3_LOCAL_ROPE_BASE)
    return out


def llama3_rope_factors(keys: ConfigKeys, base: float, head_dim: int) -> np.ndarray:
    """What llama.cpp's converter stores as rope_freqs.weight for a Llama 3.1+ checkpoint (the
    divisor of each RoPE frequency), so the GGUF and the checkpoint turn Q and K alike."""
    factor = keys.float("factor", 8.0)
    low, high = keys.float("low_freq_factor", 1.0), keys.float("high_freq_factor", 4.0)
    old_len = keys.float("original_max_position_embeddings", 8192)
    if high <= low:
        raise keys.fail(f"high_freq_factor {high} must be above low_freq_factor {low}")
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factors = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old_len / high:
            factors.append(1.0)
        elif wavelen > old_len / low:
            factors.append(factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def _gemma3(config: dict[str, Any], keys: ConfigKeys, num_layers: int, dim: int) -> dict[str, Any]:
    """Gemma 3's windows: every swa_pattern-th layer global, as the GGUF path assumes; a
    layer_types list that follows another pattern is refused."""
    pattern = keys.int("sliding_window_pattern", 0, minimum=0) or keys.int("_sliding_window_pattern",
                                                                          GEMMA3_SWA_PATTERN)
    layer_types = config.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise keys.fail(f"key 'layer_types' is {shown(layer_types)}, not a list of {num_layers} layer types")
        if "full_attention" in layer_types:
            pattern = layer_types.index("full_attention") + 1
        expected = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers)]
        if layer_types != expected:
            raise keys.fail(f"key 'layer_types' does not put a global layer every {pattern} layers (not supported)")
    return {
        "attn_scale": 1.0 / math.sqrt(keys.float("query_pre_attn_scalar", 256.0)),
        "sliding_window": keys.int("sliding_window", 0, minimum=0) if config.get("sliding_window") is not None else 0,
        "swa_pattern": pattern,
        "mlp_act": "gelu_tanh",
        "embed_scale": math.sqrt(dim),
    }


def hf_spec(config: dict[str, Any], arch: str, path: Path, vocab_rows: int) -> tuple[ModelSpec, np.ndarray | None]:
    """The spec (and Llama 3's RoPE factors, or None), once every value is in range."""
    keys = ConfigKeys(config, path)
    _check_supported(config, arch, keys)
    dim, num_heads = keys.int("hidden_size"), keys.int("num_attention_heads")
    num_kv_heads = keys.int("num_key_value_heads", num_heads)
    head_dim = keys.int("head_dim", dim // num_heads) if config.get("head_dim") is not None else dim // num_heads
    if head_dim == 0:
        raise keys.fail(f"key 'hidden_size' {dim} is smaller than 'num_attention_heads' {num_heads}")
    if num_heads % num_kv_heads:
        raise keys.fail(f"key 'num_attention_heads' {num_heads} is not a multiple of 'num_key_value_heads' "
                        f"{num_kv_heads}")
    if head_dim % 2:
        raise keys.fail(f"the head size {head_dim} is odd: RoPE turns pairs")
    vocab = keys.int("vocab_size")
    if vocab != vocab_rows:
        raise keys.fail(f"key 'vocab_size' is {vocab} but model.embed_tokens.weight has {vocab_rows} rows")
    num_layers = keys.int("num_hidden_layers")
    rope = _rope(config, arch, keys, head_dim)
    extra = _gemma3(config, keys, num_layers, dim) if arch == "gemma3" else {"attn_scale": 1.0 / math.sqrt(head_dim)}
    rope_freqs = rope.pop("rope_freqs")
    spec = ModelSpec(
        arch=arch, num_layers=num_layers, dim=dim, ffn_dim=keys.int("intermediate_size"), num_heads=num_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, vocab_size=vocab_rows,
        context_len=keys.int("max_position_embeddings"), rope_dim=head_dim, rope_style=ROPE_STYLES[arch],
        norm_eps=keys.float("rms_norm_eps", is_positive=False), **rope, **extra,
        **moe_fields(keys, arch, num_layers),
    )
    return spec, rope_freqs
