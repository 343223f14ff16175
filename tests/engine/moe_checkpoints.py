"""Tiny random mixture-of-experts checkpoints written by transformers' own classes (Qwen3-MoE
with a dense layer between MoE ones, OLMoE, Mixtral), the same weights as a GGUF (written with
gguf's own GGUFWriter, laid out as llama.cpp's converter lays them out), and the experts
transformers routes each position to (its router logits' top k), for the MoE tests."""

from pathlib import Path

import gguf
import numpy as np
import torch

from tests.helpers import tiny_gguf
from tests.hf.checkpoints import COMMON, write_checkpoint

# The configs' own special ids (Mixtral's 1 and 2, OLMoE's 50279) made the tokenizer's, so the
# directory and its GGUF end a turn on the same ids.
_SPECIAL = {"bos_token_id": tiny_gguf.vocab()[0].index("<|im_start|>"),
            "eos_token_id": tiny_gguf.vocab()[0].index("<|im_end|>")}
MOE_COMMON = COMMON | _SPECIAL | {"num_experts_per_tok": 2}
MOE_CONFIGS: dict[str, tuple[str, dict]] = {
    # norm_topk_prob as the published Qwen3-MoE checkpoints (and llama.cpp's qwen3moe) have it;
    # layer 1 dense (mlp_only_layers) between two routed layers
    "qwen3moe": ("Qwen3MoeConfig", {"num_hidden_layers": 3, "num_experts": 8, "moe_intermediate_size": 64,
                                    "norm_topk_prob": True, "mlp_only_layers": [1], "head_dim": 16}),
    "olmoe": ("OlmoeConfig", {"num_experts": 8}),  # norm_topk_prob false, OLMoE's own default
    "mixtral": ("MixtralConfig", {"num_local_experts": 4}),
}


def tiny_moe_model(name: str, seed: int = 0):
    """A transformers model of MOE_CONFIGS[name], weights drawn so the logits are peaked and the
    routers' choices well apart (no near ties between experts)."""
    import transformers

    class_name, extra = MOE_CONFIGS[name]
    config = getattr(transformers, class_name)(**(MOE_COMMON | extra))
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    rng = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=rng))
            elif "embed" in pname:
                p.copy_(torch.randn(p.shape, generator=rng))
            else:  # the last dimension is the input one, for 2D weights and 3D stacked experts alike
                p.copy_(torch.randn(p.shape, generator=rng) / p.shape[-1] ** 0.5)
    return model.eval()


def write_moe_checkpoint(name: str, directory: Path, seed: int = 0) -> Path:
    """save_pretrained (safetensors, float32) and a byte-level tokenizer."""
    return write_checkpoint(tiny_moe_model(name, seed), directory, name)


def reference_routes(directory: Path, token_ids: list[int]) -> list[torch.Tensor]:
    """The experts transformers' float32 forward routes each position to, per MoE layer:
    [len(token_ids), k] ids in increasing order."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager")
    k = model.config.num_experts_per_tok
    with torch.no_grad():
        out = model(torch.tensor([token_ids]), output_router_logits=True)
    return [logits.topk(k, dim=-1).indices.sort(dim=-1).values for logits in out.router_logits]


GGUF_ARCHS = {"qwen3moe": "qwen3moe", "olmoe": "olmoe", "mixtral": "llama"}  # llama.cpp's name for each
_LAYER_NAMES = {  # transformers' name after `model.layers.N.` -> the GGUF's after `blk.N.`
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight", "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
}
_EXPERT_NAMES = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps",
                 "w1": "ffn_gate_exps", "w3": "ffn_up_exps", "w2": "ffn_down_exps"}


def _gguf_tensors(name: str, state: dict[str, np.ndarray], config) -> dict[str, np.ndarray]:
    """The checkpoint's tensors by their GGUF names, each expert's stacked [experts, rows, K]; a
    llama's (Mixtral's) Q/K rows permuted as the converter permutes them."""
    out = {"token_embd.weight": state["model.embed_tokens.weight"], "output_norm.weight": state["model.norm.weight"],
           "output.weight": state["lm_head.weight"]}
    experts: dict[str, dict[int, np.ndarray]] = {}
    for key, value in state.items():
        if not key.startswith("model.layers."):
            continue
        layer, rest = key[len("model.layers."):].split(".", 1)
        if ".experts." in rest:  # mlp.experts.E.up_proj.weight
            expert, kind = rest.split(".experts.")[1].split(".")[:2]
            experts.setdefault(f"blk.{layer}.{_EXPERT_NAMES[kind]}.weight", {})[int(expert)] = value
        else:
            out[f"blk.{layer}.{_LAYER_NAMES[rest]}"] = value
    for key, by_expert in experts.items():
        out[key] = np.stack([by_expert[e] for e in sorted(by_expert)])
    if name == "mixtral":
        for key in list(out):
            if key.endswith(("attn_q.weight", "attn_k.weight")):
                heads = config.num_attention_heads if "attn_q" in key else config.num_key_value_heads
                out[key] = tiny_gguf.llama_permute(out[key], heads)
    return out


def write_moe_gguf(name: str, directory: Path, path: Path, expert_type=gguf.GGMLQuantizationType.F32,
                   extra: dict[str, np.ndarray] | None = None, drop: tuple[str, ...] = (), **keys) -> Path:
    """The checkpoint in `directory` (float32, one file, as save_pretrained wrote it: one tensor
    per expert) as a GGUF: every tensor F32 but the stacked experts, in `expert_type` (F32, or a
    type gguf can quantize: Q8_0...), with tiny_gguf's byte-level tokenizer; `extra` tensors and
    `keys` (the writer's add_* methods, by name, with their value) added to it, the tensors
    named in `drop` left out."""
    from safetensors.numpy import load_file
    from transformers import AutoConfig

    config, arch = AutoConfig.from_pretrained(directory), GGUF_ARCHS[name]
    state = load_file(directory / "model.safetensors")
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_expert_count(getattr(config, "num_experts", None) or config.num_local_experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    if name == "qwen3moe":
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
        writer.add_expert_weights_norm(config.norm_topk_prob)
    tokens, types = tiny_gguf.vocab()
    padding = config.vocab_size - len(tokens)  # the checkpoint's embedding has rows no token names
    tokens, types = tokens + [f"<pad_{i}>" for i in range(padding)], types + [tiny_gguf.TOKEN_NORMAL] * padding
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if name == "qwen3moe" else "gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([f"{a} {b}" for a, b in tiny_gguf.MERGES])
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(tiny_gguf.CHATML_TEMPLATE)
    for method, value in keys.items():
        getattr(writer, method)(value)
    for key, array in (_gguf_tensors(name, state, config) | (extra or {})).items():
        if key in drop:
            continue
        if key.endswith("_exps.weight") and expert_type != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(key, gguf.quants.quantize(array, expert_type), raw_dtype=expert_type)
        else:
            writer.add_tensor(key, np.ascontiguousarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
