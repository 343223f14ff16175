"""The model's facts, whichever format they were read from: its hyperparameters (ModelSpec),
its tensors (ModelFile), its text side (ModelText), and what every architecture holds (the
RoPE layout, the tensors of a layer and their shapes). No reader here: gguf/ and hf/ read
their format into these."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from batchproof.engine.memory import drop_mapped_file_pages
from batchproof.engine.model.weights import RawTensor
from batchproof.engine.text.tokenizer import Tokenizer

# The weights the native kernels multiply from their blocks; the rest (norms, biases,
# RoPE factors) are small and always dequantized.
MATMUL_WEIGHTS = {"embed", "lm_head", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down",
                  "w_gate_exp", "w_up_exp", "w_down_exp", "w_gate_exps", "w_up_exps", "w_down_exps"}
# A mixture of experts' router stays float32 (llama.cpp's quantizer never touches it either):
# its logits choose the experts, so it runs the plain float32 linear whatever the file's type.

# How each architecture's file lays out Q/K for RoPE: llama.cpp's converter permutes
# llama Q/K rows so rotation pairs are adjacent; qwen files keep Hugging Face's halves.
ROPE_STYLES: dict[str, Literal["adjacent", "halves"]] = {
    "llama": "adjacent",
    "qwen2": "halves",
    "qwen3": "halves",
    "gemma3": "halves",
    "qwen3moe": "halves",
    "olmoe": "halves",
    "mixtral": "adjacent",  # a GGUF says `llama` (with experts); its Q/K are permuted as llama's
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
    # Mixtures of experts (0 experts: a dense model): each token's MLP is the weighted sum of its
    # num_experts_used best experts (moe/), except in the dense layers (Qwen3-MoE's mlp_only_layers).
    num_experts: int = 0
    num_experts_used: int = 0
    expert_ffn_dim: int = 0
    is_topk_normalised: bool = False  # the chosen experts' probabilities rescaled to sum to 1
    dense_layers: frozenset[int] = frozenset()

    def is_moe_layer(self, layer: int) -> bool:
        return self.num_experts > 0 and layer not in self.dense_layers

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


@dataclass(frozen=True)
class ModelText:
    """What the model's front is built from, as its format gives it: the tokenizer, the chat
    template the model carries (None: none) and where it came from, the context length."""

    tokenizer: Tokenizer
    chat_template: str | None
    chat_template_origin: str
    context_len: int


# Each tensor's shape, slowest dimension first, in sizes each reader names after its own keys.
GLOBAL_SHAPES: dict[str, tuple[str, ...]] = {
    "embed": ("vocab", "dim"), "lm_head": ("vocab", "dim"), "final_norm": ("dim",), "rope_freqs": ("rope_pairs",),
}
LAYER_SHAPES: dict[str, tuple[str, ...]] = {
    "attn_norm": ("dim",), "wq": ("q_dim", "dim"), "wk": ("kv_dim", "dim"), "wv": ("kv_dim", "dim"),
    "bq": ("q_dim",), "bk": ("kv_dim",), "bv": ("kv_dim",), "q_norm": ("head_dim",), "k_norm": ("head_dim",),
    "wo": ("dim", "q_dim"), "post_attn_norm": ("dim",), "ffn_norm": ("dim",), "post_ffn_norm": ("dim",),
    "w_gate": ("ffn_dim", "dim"), "w_up": ("ffn_dim", "dim"), "w_down": ("dim", "ffn_dim"),
    # OLMoE normalises the whole Q and K projections (not each head)
    "q_norm_full": ("q_dim",), "k_norm_full": ("kv_dim",),
    # An MoE layer's router and experts: one tensor per expert (Hugging Face), or stacked (GGUF)
    "router": ("experts", "dim"),
    "w_gate_exp": ("expert_ffn", "dim"), "w_up_exp": ("expert_ffn", "dim"), "w_down_exp": ("dim", "expert_ffn"),
    "w_gate_exps": ("experts", "expert_ffn", "dim"), "w_up_exps": ("experts", "expert_ffn", "dim"),
    "w_down_exps": ("experts", "dim", "expert_ffn"),
}
EXPERT_WEIGHTS = ("w_gate_exp", "w_up_exp", "w_down_exp")  # each stacked one is this name + "s"
_DENSE_MLP = ("w_gate", "w_up", "w_down")
_CORE = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", *_DENSE_MLP)
# arch -> (each layer's required tensors, its optional ones), as llama.cpp's loader has them. A
# tensor outside both is refused: a llama file with a Q norm is not what llama.cpp runs either,
# and a Q norm without its K norm would hand a kernel no weight.
LAYER_TENSORS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "llama": (_CORE, ("bq", "bk", "bv")),
    "qwen2": ((*_CORE, "bq", "bk", "bv"), ()),
    "qwen3": ((*_CORE, "q_norm", "k_norm"), ()),
    "gemma3": ((*_CORE, "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm"), ()),
    "qwen3moe": ((*_CORE, "q_norm", "k_norm"), ()),  # an MoE layer's MLP: layer_tensors
    "olmoe": ((*_CORE, "q_norm_full", "k_norm_full"), ()),
    "mixtral": (_CORE, ()),
}


def layer_tensors(spec: ModelSpec, layer: int, is_stacked: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(required, optional) names of `layer`'s tensors: LAYER_TENSORS, with an MoE layer's MLP
    its router and experts, each expert's own ("experts.E.w_gate_exp") or stacked ("w_gate_exps")."""
    required, optional = LAYER_TENSORS[spec.arch]
    if not spec.is_moe_layer(layer):
        return required, optional
    if is_stacked:
        experts = tuple(w + "s" for w in EXPERT_WEIGHTS)
    else:
        experts = tuple(f"experts.{e}.{w}" for e in range(spec.num_experts) for w in EXPERT_WEIGHTS)
    return (*(n for n in required if n not in _DENSE_MLP), "router", *experts), optional


# The QKV biases are added as one fused bias: all three or none.
TOGETHER = ("bq", "bk", "bv")
