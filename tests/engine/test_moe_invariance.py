"""A mixture of experts changes no bit with its company: each request's tokens, logprobs (and so
its routes, which they hang on) are the same alone, in a mixed batch, prefilled in chunks of 7,
with speculative decoding, and with its prefix from a warm cache; greedy and seeded, from the Hugging Face directory and
from a GGUF whose experts are Q8_0, in both numerics. And the GGUF of the same float32 weights
gives the directory's bits exactly."""

import dataclasses
import math

import gguf
import numpy as np
import pytest
import torch

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.moe.routing import SCALAR_AT_MOST, exp_fixed, exp_fixed_scalar, exp_fixed_tensor
from batchproof.engine.sampling.params import SamplingParams
from tests.engine.moe_checkpoints import MOE_CONFIGS, write_moe_checkpoint, write_moe_gguf
from tests.hf.checkpoints import as_array

GREEDY = SamplingParams(temperature=0, max_tokens=12, top_logprobs=3, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=11, max_tokens=12, top_logprobs=2, ignore_eos=True)


def _prompts() -> dict[str, tuple[list[int], SamplingParams]]:
    """Six requests sharing a 40-token prefix (two and a half cache blocks), of 3 to 40 more
    tokens each, greedy and seeded by turns."""
    rng = np.random.default_rng(5)
    shared = rng.integers(0, 256, 40).tolist()
    return {f"r{i}": (shared + rng.integers(0, 256, n).tolist(), GREEDY if i % 2 else SEEDED)
            for i, n in enumerate((3, 17, 9, 40, 1, 25))}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """name -> {"hf": the directory, "gguf": its F32 GGUF, "q8": its GGUF with Q8_0 experts}."""
    root = tmp_path_factory.mktemp("moe")
    made = {}
    for name in MOE_CONFIGS:
        directory = write_moe_checkpoint(name, root / name)
        made[name] = {"hf": directory, "gguf": write_moe_gguf(name, directory, root / f"{name}.gguf"),
                      "q8": write_moe_gguf(name, directory, root / f"{name}-q8.gguf", gguf.GGMLQuantizationType.Q8_0)}
    return made


def engine_on(path, **settings) -> Engine:
    return Engine(EngineConfig(model_path=path, device="cpu", max_batch=8, num_threads=1,
                               **({"speculative": False} | settings)))


def run(engine: Engine, requests: dict) -> dict[str, np.ndarray]:
    out = engine.generate(requests)
    return {rid: as_array([r for delta in deltas for r in delta.records]) for rid, deltas in out.items()}


@pytest.mark.parametrize("source,numerics", [("hf", "float32"), ("q8", "float32"), ("q8", "int8")])
@pytest.mark.parametrize("name", list(MOE_CONFIGS))
def test_alone_equals_batched_chunked_and_warm_cache(name, source, numerics, sources):
    path, requests = sources[name][source], _prompts()
    cold = engine_on(path, numerics=numerics, prefix_cache=False)
    alone = {rid: run(cold, {rid: request})[rid] for rid, request in requests.items()}
    chunked = engine_on(path, numerics=numerics, prefix_cache=False, max_prefill_tokens=7)
    speculative = engine_on(path, numerics=numerics, prefix_cache=False, speculative=True)
    for label, engine in [("batched", cold), ("chunked", chunked), ("speculative", speculative)]:
        together = run(engine, requests)
        for rid in requests:
            assert np.array_equal(together[rid], alone[rid]), f"{name} {source} {numerics}: {rid} {label}"
    warm = engine_on(path, numerics=numerics)
    run(warm, requests)
    before = warm.prefix_cache.stats.hit_tokens
    again = run(warm, requests)
    assert warm.prefix_cache.stats.hit_tokens - before >= 32 * len(requests)  # two whole blocks each, at least
    for rid in requests:
        assert np.array_equal(again[rid], alone[rid]), f"{name} {source} {numerics}: {rid} from a warm cache"


@pytest.mark.parametrize("source,numerics", [("hf", "float32"), ("q8", "float32"), ("q8", "int8")])
@pytest.mark.parametrize("name", list(MOE_CONFIGS))
def test_the_fused_decode_step_is_the_op_by_op_bits(name, source, numerics, sources):
    """A decode step runs every layer in one C call (layers.c; the routing and the experts by
    moe.c), or op by op with the fused calls off (the router, top k, exp_fixed and the experts from
    Python): every request alone and all six together, the same bits; and asked for its routing,
    the same receipt both ways (the fused call writing out the experts it chose)."""
    fused, by_ops = (engine_on(sources[name][source], numerics=numerics, prefix_cache=False) for _ in range(2))
    by_ops.model.ops.is_fused = False
    requests = _prompts()
    expected = run(by_ops, requests)
    assert all(np.array_equal(got, expected[rid]) for rid, got in run(fused, requests).items()), "batched"
    routed = {rid: (prompt, dataclasses.replace(params, return_routed_experts=True))
              for rid, (prompt, params) in requests.items()}
    receipts = {label: {rid: deltas[-1].routed_experts for rid, deltas in engine.generate(routed).items()}
                for label, engine in (("fused", fused), ("by ops", by_ops))}
    for rid, (prompt, params) in requests.items():
        assert np.array_equal(run(by_ops, {rid: (prompt, params)})[rid], expected[rid]), f"{rid} alone"
        assert np.array_equal(run(fused, {rid: (prompt, params)})[rid], expected[rid]), f"{rid} fused"
        assert receipts["fused"][rid].shape == (len(prompt) + params.max_tokens - 1, *receipts["fused"][rid].shape[1:])
        assert np.array_equal(receipts["fused"][rid], receipts["by ops"][rid]), f"{rid} routes"
    described = fused.model.ops._fused
    assert described is not None and len(described.moes) == sum(layer.moe is not None
                                                                  for layer in fused.model.layers) > 0


@pytest.mark.parametrize("name", list(MOE_CONFIGS))
def test_the_gguf_of_the_same_float32_weights_gives_the_same_bits(name, sources):
    """Stacked experts split per expert, OLMoE's whole-projection norms, Mixtral read as llama
    with experts (its Q/K permuted): the same arithmetic as the directory's, to the bit."""
    requests = _prompts()
    ours = run(engine_on(sources[name]["hf"], prefix_cache=False), requests)
    theirs = run(engine_on(sources[name]["gguf"], prefix_cache=False), requests)
    for rid in requests:
        assert np.array_equal(ours[rid], theirs[rid]), f"{name}: {rid}"


def test_exp_fixed_is_exp_to_float32_and_the_same_bits_in_any_company():
    """The routing's exp: within a float32 rounding of torch's float64 exp, and an element's bits
    do not depend on where it sits or how many share the call (torch's vectorised body vs tail)."""
    x = -torch.rand(1000, dtype=torch.float64) * 30
    assert torch.allclose(exp_fixed(x).float(), x.exp().float(), rtol=2 ** -23, atol=0)
    for n in (1, 3, 7, 8, 17, 999):
        assert torch.equal(exp_fixed(x[:n]), exp_fixed(x)[:n])
        assert torch.equal(exp_fixed(x[-n:]), exp_fixed(x)[-n:])
    assert exp_fixed(torch.tensor([float("-inf"), 0.0], dtype=torch.float64)).float().tolist() == [0.0, 1.0]


def test_exp_fixed_on_python_floats_is_the_tensor_path_bit_for_bit():
    """A decode step's few routing weights take the scalar route (exp_fixed_scalar), larger
    batches the tensor one: the same bits for every value, edges included."""
    values = torch.cat([-torch.rand(5000, dtype=torch.float64) * 60, torch.rand(500, dtype=torch.float64) * 3,
                        torch.tensor([0.0, -0.0, -700.0, 700.0, -701.0, 1e9, -1e9, float("-inf"), float("inf"),
                                      0.5 * math.log(2), -0.5 * math.log(2), -1e-300], dtype=torch.float64)])
    scalar = torch.tensor([exp_fixed_scalar(v) for v in values.tolist()], dtype=torch.float64)
    assert torch.equal(scalar, exp_fixed_tensor(values))
    assert math.isnan(exp_fixed_scalar(math.nan)) and exp_fixed_tensor(torch.tensor([math.nan])).isnan().all()
    small = values[:SCALAR_AT_MOST].view(8, -1)
    assert torch.equal(exp_fixed(small), exp_fixed_tensor(small))
