"""Gemma 3 270M's decode step in one C call (layers.c) against the same kernels called op by op
from Python (transformer.py's decode_layers): the same greedy tokens, logprobs and top logprobs,
bit for bit, alone and in batches, with a prompt long enough for the local layers' sliding
window (512) to cut in; and the same hidden states and KV cache after one step.

Skipped where the package is not installed; in CI, which installs it, they fail instead."""

from pathlib import Path

import pytest
import torch

from batchproof.engine.cache.kv_cache import KVCache
from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.ops import KernelOps, kernels
from batchproof.engine.model.transformer import Segment
from batchproof.engine.sampling.params import SamplingParams
from tests.helpers.second_model import gemma_package  # noqa: F401 (a fixture)

pytestmark = [
    pytest.mark.usefixtures("gemma_package"),
    pytest.mark.skipif(not kernels.available(), reason="the kernels are not built here"),
]
WINDOW = 512  # the local layers' sliding window
TEXTS = ["The capital of France is", "Write a haiku about the sea.", "1, 2, 3, 4,", "def fibonacci(n):",
         "Once upon a time", "The three primary colours are"]


@pytest.fixture(scope="module")
def gemma() -> Engine:
    # The prefix cache keeps the long prompt's prefill from being repeated (prefill is not the
    # path under test, and a cached prefix is bitwise the recomputed one); decode steps never hit it.
    engine = Engine(EngineConfig(model_path=Path("gemma3-270m"), device="cpu", max_batch=16, max_model_len=640))
    assert isinstance(engine.model.ops, KernelOps) and engine.spec.window(0) == WINDOW
    return engine


@pytest.fixture(scope="module")
def prompts(gemma: Engine) -> list[list[int]]:
    """Short prompts of different lengths, and one that the window cuts in on from the first decode step."""
    encode = gemma.tokenizer.encode
    long = encode(" ".join(f"item {i}," for i in range(400)), add_bos=True)[:WINDOW + 3]
    assert len(long) == WINDOW + 3
    return [long, *(encode(text, add_bos=True) for text in TEXTS)]


def signature(gemma: Engine, prompts: list[list[int]], is_fused: bool) -> list[tuple]:
    """Every request's greedy tokens, logprobs and top five (as hex: the bits), decoded together."""
    params = SamplingParams(temperature=0.0, max_tokens=6, top_logprobs=5, ignore_eos=True)
    gemma.model.ops.is_fused = is_fused
    try:
        out = gemma.generate({str(i): (p, params) for i, p in enumerate(prompts)})
    finally:
        gemma.model.ops.is_fused = True
    return [(i, r.token_id, r.logprob.hex(), tuple((t.token_id, t.logit.hex(), t.logprob.hex()) for t in r.top))
            for i in range(len(prompts)) for d in out[str(i)] for r in d.records]


def test_the_fused_step_runs_instead_of_the_op_by_op_loop(gemma: Engine, prompts, monkeypatch) -> None:
    loop, num_calls = gemma.model.decode_layers, [0]

    def counted(*args) -> torch.Tensor:
        num_calls[0] += 1
        return loop(*args)

    monkeypatch.setattr(gemma.model, "decode_layers", counted)
    signature(gemma, prompts[1:2], is_fused=True)
    assert num_calls == [0]
    signature(gemma, prompts[1:2], is_fused=False)
    assert num_calls == [5]  # six tokens: the first from the prefill, five decode steps


@pytest.mark.parametrize("batch", [1, 3, 16])
def test_fused_and_op_by_op_decode_give_the_same_bits(gemma: Engine, prompts, batch: int) -> None:
    """The long prompt alone, then among short ones (repeated to fill 16)."""
    long, short = prompts[0], prompts[1:]
    chosen = [long, *(short[i % len(short)] for i in range(batch - 1))]
    fused = signature(gemma, chosen, is_fused=True)
    assert len(fused) == batch * 6
    assert fused == signature(gemma, chosen, is_fused=False)


@torch.inference_mode()
def test_one_step_writes_the_same_cache_and_hidden_states(gemma: Engine, prompts) -> None:
    """Rows at three positions (one past the window) in slots 0..2: the hidden states after
    the final norm and every layer's new keys and values, bit for bit."""
    model, s = gemma.model, gemma.spec
    chosen = [prompts[0], prompts[1], prompts[3]]

    def step(is_fused: bool) -> tuple[torch.Tensor, ...]:
        model.ops.is_fused = is_fused
        cache = KVCache(s.num_layers, 3, s.num_kv_heads, 640, s.head_dim, torch.device("cpu"), torch.float32)
        for slot, ids in enumerate(chosen):
            model.prefill([Segment(torch.tensor(ids[:-1]), 0, slot)], cache)
        positions = torch.tensor([len(ids) - 1 for ids in chosen])
        hidden = model.decode(torch.tensor([ids[-1] for ids in chosen]), positions, torch.arange(3), 3, cache)
        written = [c[:, slot, :, :int(n) + 1].clone() for c in (cache.k, cache.v) for slot, n in enumerate(positions)]
        return hidden, *written  # (the cache past each slot's position is unwritten: torch.empty)

    try:
        fused, op_by_op = step(True), step(False)
    finally:
        model.ops.is_fused = True
    for a, b in zip(fused, op_by_op, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
