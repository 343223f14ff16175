"""A mixture of experts' config.json keys (Qwen3-MoE, OLMoE, Mixtral) read into the ModelSpec's
expert fields, as transformers' modelling code reads them; a variant we do not run (a shared
expert, QKV clipping, a sliding window) is refused with one line naming its key."""

from typing import Any

from batchproof.engine.model.errors import Metadata, shown

# arch -> (the key counting the experts, the one giving an expert's MLP size). transformers v5
# writes Qwen3-MoE's count as num_local_experts, v4 (and the published checkpoints) num_experts.
EXPERT_KEYS: dict[str, tuple[str, str]] = {
    "qwen3moe": ("num_experts", "moe_intermediate_size"),
    "olmoe": ("num_experts", "intermediate_size"),
    "mixtral": ("num_local_experts", "intermediate_size"),
}
COUNT_KEY_ALIASES = {"num_experts": "num_local_experts", "num_local_experts": "num_experts"}
# Keys whose other values change the arithmetic in ways not implemented here: value we require.
MOE_MUST_BE: dict[str, dict[str, Any]] = {
    "qwen3moe": {"shared_expert_intermediate_size": 0},
    "olmoe": {"clip_qkv": None},
    "mixtral": {"sliding_window": None},
}


def _flag(keys: Metadata, key: str, default: bool) -> bool:
    value = keys.meta.get(key, default)
    if not isinstance(value, bool):
        raise keys.fail(f"{keys.kind} {key!r} is {shown(value)}, not true or false")
    return value


def _dense_layers(keys: Metadata, num_layers: int) -> frozenset[int]:
    """Qwen3-MoE's layers with a dense MLP: those in mlp_only_layers, and all but every
    decoder_sparse_step-th (transformers' Qwen3MoeDecoderLayer)."""
    step = keys.int("decoder_sparse_step", 1)
    only = keys.meta.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise keys.fail(f"{keys.kind} 'mlp_only_layers' is {shown(only)}, not a list of layer indices")
    return frozenset(i for i in range(num_layers) if i in only or (i + 1) % step)


def moe_fields(keys: Metadata, arch: str, num_layers: int) -> dict[str, Any]:
    """The ModelSpec's expert fields of a `arch` config (an empty dict for a dense architecture)."""
    if arch not in EXPERT_KEYS:
        return {}
    for key, required in MOE_MUST_BE[arch].items():
        if keys.meta.get(key) not in (required, None):
            raise keys.fail(f"{keys.kind} {key!r} is {shown(keys.meta[key])}; only {shown(required)} is supported "
                            f"(a {arch} variant batchproof does not run)")
    count_key, ffn_key = EXPERT_KEYS[arch]
    if count_key not in keys.meta and COUNT_KEY_ALIASES[count_key] in keys.meta:
        count_key = COUNT_KEY_ALIASES[count_key]
    num_experts = keys.int(count_key)
    num_used = keys.int("num_experts_per_tok")
    if num_used > num_experts:
        raise keys.fail(f"{keys.kind} 'num_experts_per_tok' {num_used} is above {count_key!r} {num_experts}")
    return {
        "num_experts": num_experts,
        "num_experts_used": num_used,
        "expert_ffn_dim": keys.int(ffn_key),
        # Mixtral always renormalises; the others as norm_topk_prob says (transformers' default: false)
        "is_topk_normalised": arch == "mixtral" or _flag(keys, "norm_topk_prob", False),
        "dense_layers": _dense_layers(keys, num_layers) if arch == "qwen3moe" else frozenset(),
    }
