"""A GGUF mixture of experts' metadata (qwen3moe, olmoe, and llama with experts: Mixtral) read
into the ModelSpec's expert fields as llama.cpp reads it; a variant we do not run (shared
experts, sigmoid gating, scaled weights) is refused with one line naming its key."""

from typing import Any

from batchproof.engine.model.errors import Metadata, shown

# arch -> whether llama.cpp renormalises the chosen experts' weights when the file has no
# {arch}.expert_weights_norm: its qwen3moe and llama (Mixtral) graphs do, its olmoe graph does not.
TOPK_NORMALISED: dict[str, bool] = {"qwen3moe": True, "olmoe": False, "llama": True}
GATING_SOFTMAX = 1  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX


def _refuse_variants(keys: Metadata, arch: str) -> None:
    for key in (f"{arch}.expert_shared_count", f"{arch}.expert_shared_feed_forward_length"):
        if keys.meta.get(key, 0) != 0:
            raise keys.fail(f"{key} is {shown(keys.meta[key])}: shared experts are not supported")
    if keys.meta.get(f"{arch}.expert_gating_func", GATING_SOFTMAX) != GATING_SOFTMAX:
        raise keys.fail(f"{arch}.expert_gating_func is {shown(keys.meta[f'{arch}.expert_gating_func'])}: only "
                        f"softmax gating ({GATING_SOFTMAX}) is supported")
    if keys.meta.get(f"{arch}.expert_weights_scale", 1.0) != 1.0:
        raise keys.fail(f"{arch}.expert_weights_scale is {shown(keys.meta[f'{arch}.expert_weights_scale'])}: "
                        "only 1.0 is supported")


def moe_fields(keys: Metadata, arch: str, ffn_dim: int, num_layers: int, entries: dict[str, Any]) -> dict[str, Any]:
    """The ModelSpec's expert fields (an empty dict for a dense model). `entries`: the file's
    tensors by our name (a qwen3moe layer holding a dense MLP's tensors is a dense layer)."""
    count_key = f"{arch}.expert_count"
    if arch not in TOPK_NORMALISED or (arch == "llama" and not keys.meta.get(count_key)):
        return {}
    _refuse_variants(keys, arch)
    num_experts = keys.int(count_key)
    num_used = keys.int(f"{arch}.expert_used_count")
    if num_used > num_experts:
        raise keys.fail(f"{arch}.expert_used_count {num_used} is above {count_key} {num_experts}")
    norm_key = f"{arch}.expert_weights_norm"
    is_normalised = keys.meta.get(norm_key, TOPK_NORMALISED[arch])
    if not isinstance(is_normalised, bool):
        raise keys.fail(f"{norm_key} is {shown(is_normalised)}, not true or false")
    return {
        "num_experts": num_experts,
        "num_experts_used": num_used,
        "expert_ffn_dim": keys.int(f"{arch}.expert_feed_forward_length", ffn_dim),
        "is_topk_normalised": is_normalised,
        "dense_layers": frozenset(i for i in range(num_layers) if f"layers.{i}.w_gate" in entries)
        if arch == "qwen3moe" else frozenset(),
    }
