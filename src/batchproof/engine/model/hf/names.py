"""Hugging Face checkpoint tensor names and ours: the mapping is data (dicts), read both ways."""

# HF tensor name -> our weight name, for every architecture.
GLOBAL_TENSOR_NAMES: dict[str, str] = {
    "model.embed_tokens.weight": "embed",
    "model.norm.weight": "final_norm",
    "lm_head.weight": "lm_head",
}
_ATTENTION_AND_MLP: dict[str, str] = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "wq",
    "self_attn.k_proj.weight": "wk",
    "self_attn.v_proj.weight": "wv",
    "self_attn.q_proj.bias": "bq",
    "self_attn.k_proj.bias": "bk",
    "self_attn.v_proj.bias": "bv",
    "self_attn.q_norm.weight": "q_norm",
    "self_attn.k_norm.weight": "k_norm",
    "self_attn.o_proj.weight": "wo",
    "mlp.gate_proj.weight": "w_gate",
    "mlp.up_proj.weight": "w_up",
    "mlp.down_proj.weight": "w_down",
}
# `model.layers.N.` + name -> ours, per architecture: Gemma 3's "post_attention_layernorm"
# normalises the attention output, where llama's is the norm before the MLP.
LAYER_TENSOR_NAMES: dict[str, dict[str, str]] = {
    "llama": _ATTENTION_AND_MLP | {"post_attention_layernorm.weight": "ffn_norm"},
    "qwen2": _ATTENTION_AND_MLP | {"post_attention_layernorm.weight": "ffn_norm"},
    "qwen3": _ATTENTION_AND_MLP | {"post_attention_layernorm.weight": "ffn_norm"},
    "gemma3": _ATTENTION_AND_MLP | {
        "post_attention_layernorm.weight": "post_attn_norm",
        "pre_feedforward_layernorm.weight": "ffn_norm",
        "post_feedforward_layernorm.weight": "post_ffn_norm",
    },
    "qwen3moe": _ATTENTION_AND_MLP | {"post_attention_layernorm.weight": "ffn_norm", "mlp.gate.weight": "router"},
    "olmoe": _ATTENTION_AND_MLP | {
        "post_attention_layernorm.weight": "ffn_norm",
        "mlp.gate.weight": "router",
        "self_attn.q_norm.weight": "q_norm_full",  # OLMoE's norms span the whole projection
        "self_attn.k_norm.weight": "k_norm_full",
    },
    "mixtral": _ATTENTION_AND_MLP | {"post_attention_layernorm.weight": "ffn_norm",
                                     "block_sparse_moe.gate.weight": "router"},
}
# An MoE layer's experts, one set of tensors each: `model.layers.N.` + prefix + `E.` + name ->
# "layers.N.experts.E." + ours (transformers' save_pretrained writes this layout).
EXPERT_PREFIXES: dict[str, str] = {"qwen3moe": "mlp.experts.", "olmoe": "mlp.experts.",
                                   "mixtral": "block_sparse_moe.experts."}
_GATE_UP_DOWN = {"gate_proj.weight": "w_gate_exp", "up_proj.weight": "w_up_exp", "down_proj.weight": "w_down_exp"}
EXPERT_TENSOR_NAMES: dict[str, dict[str, str]] = {
    "qwen3moe": _GATE_UP_DOWN,
    "olmoe": _GATE_UP_DOWN,
    "mixtral": {"w1.weight": "w_gate_exp", "w3.weight": "w_up_exp", "w2.weight": "w_down_exp"},
}
# Buffers some checkpoints carry that the model recomputes (never weights).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
LAYER_PREFIX = "model.layers."


def _is_index(text: str) -> bool:
    """Only a plain decimal index names a layer or an expert ("layers.01." would alias "layers.1.")."""
    return text.isascii() and text.isdigit() and str(int(text)) == text


def _expert_name(arch: str, rest: str) -> str | None:
    """"mlp.experts.5.up_proj.weight" -> "experts.5.w_up_exp"; None if it is no expert's."""
    prefix = EXPERT_PREFIXES.get(arch)
    if prefix is None or not rest.startswith(prefix):
        return None
    expert, _, name = rest[len(prefix):].partition(".")
    short = EXPERT_TENSOR_NAMES[arch].get(name)
    return None if short is None or not _is_index(expert) else f"experts.{expert}.{short}"


def our_name(arch: str, hf_name: str) -> str | None:
    """"model.layers.3.self_attn.q_proj.weight" -> "layers.3.wq"; None for a name we do not know."""
    if hf_name.startswith(LAYER_PREFIX):
        layer, _, rest = hf_name[len(LAYER_PREFIX):].partition(".")
        short = LAYER_TENSOR_NAMES[arch].get(rest) or _expert_name(arch, rest)
        return None if short is None or not _is_index(layer) else f"layers.{layer}.{short}"
    return GLOBAL_TENSOR_NAMES.get(hf_name)


def hf_name(arch: str, name: str) -> str:
    """Ours back to the checkpoint's: "layers.3.wq" -> "model.layers.3.self_attn.q_proj.weight"."""
    if name.startswith("layers."):
        _, layer, short = name.split(".", 2)
        if short.startswith("experts."):
            _, expert, ours = short.split(".")
            theirs = {o: h for h, o in EXPERT_TENSOR_NAMES[arch].items()}[ours]
            return f"{LAYER_PREFIX}{layer}.{EXPERT_PREFIXES[arch]}{expert}.{theirs}"
        theirs = {ours: hf for hf, ours in LAYER_TENSOR_NAMES[arch].items()}[short]
        return f"{LAYER_PREFIX}{layer}.{theirs}"
    return {ours: hf for hf, ours in GLOBAL_TENSOR_NAMES.items()}[name]
