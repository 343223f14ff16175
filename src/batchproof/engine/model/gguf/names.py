"""GGUF tensor names and ours: the mapping is data (two dicts), read both ways."""

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
    "post_attention_norm.weight": "post_attn_norm",  # gemma3: normalises the attention output
    "ffn_norm.weight": "ffn_norm",
    "post_ffw_norm.weight": "post_ffn_norm",  # gemma3: normalises the MLP output
    "ffn_gate.weight": "w_gate",
    "ffn_up.weight": "w_up",
    "ffn_down.weight": "w_down",
    "ffn_gate_inp.weight": "router",  # a mixture of experts' router and its experts, stacked [experts, ...]
    "ffn_gate_exps.weight": "w_gate_exps",
    "ffn_up_exps.weight": "w_up_exps",
    "ffn_down_exps.weight": "w_down_exps",
}
# Where an architecture's tensor under a shared GGUF name is another of ours: OLMoE's Q/K norms
# span the whole projection, not a head.
ARCH_RENAMES: dict[str, dict[str, str]] = {"olmoe": {"q_norm": "q_norm_full", "k_norm": "k_norm_full"}}
# Tensors of MoE variants we do not run: refused by name, never ignored (a shared expert or a
# routing bias left unread would change every answer).
UNSUPPORTED_MOE_TENSORS: dict[str, str] = {
    "_shexp.": "a shared expert", "exp_probs_b.": "a router bias (expert_probs_b)", "_chexp.": "chunked experts",
}
_GGUF_GLOBAL = {ours: theirs for theirs, ours in GLOBAL_TENSOR_NAMES.items()}
_GGUF_LAYER = {ours: theirs for theirs, ours in LAYER_TENSOR_NAMES.items()}


def our_name(gguf_name: str, arch: str = "") -> str | None:
    """"blk.3.attn_q.weight" -> "layers.3.wq"; None for a tensor the model does not use."""
    if gguf_name.startswith("blk."):
        layer, _, rest = gguf_name[4:].partition(".")
        short = LAYER_TENSOR_NAMES.get(rest)
        short = ARCH_RENAMES.get(arch, {}).get(short, short)
        # Only a plain decimal index names a layer ("blk.01." would alias "blk.1.").
        is_index = layer.isascii() and layer.isdigit() and str(int(layer)) == layer
        return None if short is None or not is_index else f"layers.{layer}.{short}"
    return GLOBAL_TENSOR_NAMES.get(gguf_name)


def gguf_name(name: str) -> str:
    """Ours back to the file's: "layers.3.wq" -> "blk.3.attn_q.weight" (to name a missing tensor)."""
    if name.startswith("layers."):
        _, layer, short = name.split(".", 2)
        short = {ours: theirs for arch in ARCH_RENAMES.values() for theirs, ours in arch.items()}.get(short, short)
        return f"blk.{layer}.{_GGUF_LAYER[short]}"
    return _GGUF_GLOBAL[name]
