"""The named shapes `batchproof bench --write-model --shape` writes are the real models' own
(Llama 3.2 1B and 3B, OLMoE-1B-7B), and their planned files the sizes the issues expect, counted
from the tensor list without writing a byte; a shape that is neither a dense llama nor a
GQA-free mixture of experts is refused naming what is wrong."""

import pytest

from batchproof.commands.bench import random_model

VOCAB = 49152  # the default model's tokenizer, which every file borrows


def _planned(name: str) -> tuple[float, float]:
    """(parameters in billions, file bytes in GB) of the named shape's Q4_K_M tensors."""
    listed = random_model.tensors(random_model.SHAPES[name], "q4_k_m", VOCAB)
    return sum(t.num_params for t in listed) / 1e9, sum(t.num_bytes for t in listed) / 1e9


def test_llama_3b_is_llama_3_2_3bs_shape_at_about_1_8_gb() -> None:
    shape = random_model.SHAPES["llama-3b"]
    assert (shape.num_layers, shape.dim, shape.ffn_dim, shape.num_heads, shape.num_kv_heads, shape.head_dim) == (
        28, 3072, 8192, 24, 8, 128)
    params, size = _planned("llama-3b")
    assert 2.9 < params < 3.0 and 1.75 < size < 1.9  # 3.21B with Llama's own 128,256-token vocabulary


def test_olmoe_1b_7b_is_olmoes_shape_at_about_4_2_gb() -> None:
    shape = random_model.SHAPES["olmoe-1b-7b"]
    assert (shape.arch, shape.num_layers, shape.dim, shape.ffn_dim, shape.num_heads, shape.num_kv_heads,
            shape.head_dim, shape.num_experts, shape.num_experts_used) == ("olmoe", 16, 2048, 1024, 16, 16, 128, 64, 8)
    params, size = _planned("olmoe-1b-7b")
    assert 6.8 < params < 7.0 and 4.1 < size < 4.3  # 6.92B with OLMoE's 50,304-token vocabulary


def test_the_1b_file_is_unchanged() -> None:
    params, size = _planned("llama-1b")
    assert round(params * 1e9) == 1_073_809_408 and round(size * 1e9) == 666_968_064


@pytest.mark.parametrize("wrong,named", [
    ({"arch": "qwen3moe"}, "arch"),
    ({"arch": "olmoe", "num_experts": 4, "num_experts_used": 5}, "num_experts_used"),
    ({"arch": "olmoe", "num_experts": 4, "num_experts_used": 2, "num_kv_heads": 1}, "GQA"),
    ({"num_experts": 4, "num_experts_used": 2}, "dense"),
])
def test_a_shape_neither_llama_nor_olmoe_is_refused_by_name(wrong, named) -> None:
    settings = {"num_layers": 2, "dim": 256, "ffn_dim": 256, "num_heads": 2, "num_kv_heads": 2} | wrong
    with pytest.raises(ValueError, match=named):
        random_model.Shape(**settings)
