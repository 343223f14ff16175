"""`batchproof bench --write-model --shape olmoe-1b-7b`'s writer at a small shape: the keys and
tensors llama.cpp writes for an `olmoe` file, typed as its quantize types a Q4_K_M, loaded by
our engine as a mixture of experts whose router spreads tokens over the experts, and decoded
greedily alone == in a batch, bitwise, in both numerics."""

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from batchproof.cli import main
from batchproof.commands.bench import random_model
from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.gguf.reader import read_gguf
from batchproof.engine.sampling.params import SamplingParams

Q = gguf.GGMLQuantizationType
# OLMoE's structure at a size that loads in a second: eight layers (so Q4_K_M's 6-bit layers are
# a proper subset), eight experts of which two are used, two heads of 128 without GQA.
TINY = random_model.Shape(num_layers=8, dim=256, ffn_dim=256, num_heads=2, num_kv_heads=2, context_len=256,
                          rope_base=10000.0, arch="olmoe", num_experts=8, num_experts_used=2)
MORE_BITS_OF_8 = {0, 3, 6, 7}  # llama.cpp's use_more_bits at 8 layers, as the llama test works it
VOCAB = 49152  # the default model's tokenizer


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("random_olmoe") / "olmoe.gguf"
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(random_model.SHAPES, "tiny-olmoe", TINY)
        assert main(["bench", "--write-model", str(path), "--shape", "tiny-olmoe"]) == 0
    return path


def test_the_keys_are_an_olmoe_files(written) -> None:
    meta, _ = read_gguf(written)
    assert meta["general.architecture"] == "olmoe"
    want = {"block_count": 8, "embedding_length": 256, "feed_forward_length": 256, "attention.head_count": 2,
            "attention.head_count_kv": 2, "expert_count": 8, "expert_used_count": 2, "context_length": 256}
    assert {k: meta[f"olmoe.{k}"] for k in want} == want
    assert meta["olmoe.rope.freq_base"] == 10000.0 and meta["olmoe.attention.layer_norm_rms_epsilon"] > 0
    # what llama.cpp's converter leaves out for olmoe, so each reader's default applies
    assert not [k for k in meta if k.startswith("olmoe.") and ("expert_weights" in k or "expert_feed" in k
                                                               or "shared" in k or "gating" in k)]


def test_the_tensors_have_olmoes_names_shapes_and_q4_k_m_types(written) -> None:
    """Shapes in the file's order (fastest dimension first), as llama.cpp's olmoe loader asks
    for them: the router [dim, experts], the experts [K, rows, experts], the norms [dim]."""
    _, entries = read_gguf(written)
    found = {e.name: (list(reversed(e.shape)), Q(e.qtype)) for e in entries}
    assert found.pop("token_embd.weight") == ([256, VOCAB], Q.Q4_K)  # untied: the default type
    assert found.pop("output.weight") == ([256, VOCAB], Q.Q6_K)
    assert found.pop("output_norm.weight") == ([256], Q.F32)
    for i in range(TINY.num_layers):
        six_bits = Q.Q6_K if i in MORE_BITS_OF_8 else Q.Q4_K
        want = {"attn_norm": ([256], Q.F32), "attn_q": ([256, 256], Q.Q4_K), "attn_k": ([256, 256], Q.Q4_K),
                "attn_v": ([256, 256], six_bits), "attn_output": ([256, 256], Q.Q4_K),
                "attn_q_norm": ([256], Q.F32), "attn_k_norm": ([256], Q.F32), "ffn_norm": ([256], Q.F32),
                "ffn_gate_inp": ([256, 8], Q.F32), "ffn_gate_exps": ([256, 256, 8], Q.Q4_K),
                "ffn_up_exps": ([256, 256, 8], Q.Q4_K), "ffn_down_exps": ([256, 256, 8], six_bits)}
        assert {short: found.pop(f"blk.{i}.{short}.weight") for short in want} == want, i
    assert found == {}


def test_each_expert_has_weights_of_variance_one_over_k(written) -> None:
    _, entries = read_gguf(written)
    stacked = next(e for e in entries if e.name == "blk.0.ffn_down_exps.weight")
    w = gguf.quants.dequantize(stacked.data, Q(stacked.qtype)).reshape(stacked.shape)
    stds = w.reshape(TINY.num_experts, -1).std(axis=1)
    assert np.all(np.abs(stds * np.sqrt(TINY.ffn_dim) - 1) < 0.05)


def _decode(engine: Engine, prompts: dict[str, list[int]]) -> dict[str, list[tuple]]:
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, top_logprobs=3,
                            return_routed_experts=True)
    out = engine.generate({rid: (ids, params) for rid, ids in prompts.items()})
    result = {}
    for rid, deltas in out.items():
        records = [r for d in deltas for r in d.records]
        result[rid] = ([r.token_id for r in records], [r.logprob for r in records],
                       [[t.logit for t in r.top] for r in records], deltas[-1].routed_experts)
    return result


@pytest.mark.parametrize("numerics", ["float32", "int8"])
@torch.inference_mode()
def test_our_engine_decodes_it_alone_as_in_a_batch(written, numerics) -> None:
    engine = Engine(EngineConfig(model_path=written, device="cpu", max_batch=4, num_threads=1, numerics=numerics,
                                 prefix_cache=False, speculative=False))
    assert (engine.spec.arch, engine.spec.num_experts, engine.spec.num_experts_used) == ("olmoe", 8, 2)
    assert not engine.spec.is_topk_normalised  # olmoe's default, the converter writing no key
    rng = np.random.default_rng(3)
    prompts = {f"r{i}": rng.integers(0, VOCAB, n).tolist() for i, n in enumerate((5, 19, 11))}
    alone = {rid: _decode(engine, {rid: ids})[rid] for rid, ids in prompts.items()}
    together = _decode(engine, prompts)
    for rid in prompts:
        tokens, logprobs, tops, routes = together[rid]
        assert tokens == alone[rid][0] and logprobs == alone[rid][1] and tops == alone[rid][2], rid
        assert np.array_equal(routes, alone[rid][3]), rid
        assert np.isfinite(logprobs).all() and all(-np.log(VOCAB) < lp < 0 for lp in logprobs)
    # the router is not degenerate: the tokens go to every expert, more than one pair of them
    routes = np.concatenate([together[rid][3] for rid in prompts])  # [positions, layers, k]
    assert set(routes.ravel().tolist()) == set(range(TINY.num_experts))
    assert len({tuple(row) for row in routes.reshape(-1, TINY.num_experts_used).tolist()}) > 4
