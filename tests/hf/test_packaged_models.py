"""The packaged models converted to Hugging Face checkpoints by transformers (float32 and
bfloat16), served from their directories: bitwise the GGUF's answers (dequantized at load:
--weights float32), transformers' float32 logprobs within 1e-4 with the same greedy tokens,
the bfloat16 copy batch-invariant. Slow: the conversion alone takes ~50 s (SmolLM2) and ~2 min
(Gemma 3, whose Q4_K_M transformers dequantizes in numpy)."""

import importlib.util
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.sampling.params import SamplingParams
from tests.hf.checkpoints import as_array, convert_gguf, greedy_check, reference_logprobs

pytestmark = pytest.mark.slow
TEXTS = ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a small village,",
         "Water boils at 100 degrees and"]
GREEDY = SamplingParams(temperature=0, max_tokens=12, top_logprobs=5)
SAMPLED = SamplingParams(temperature=0.9, seed=7, max_tokens=12, top_logprobs=2)


def _gguf(name: str) -> Path | None:
    from batchproof.engine.model.known_models import KNOWN_MODELS, resolve_model

    return resolve_model(name) if importlib.util.find_spec(KNOWN_MODELS[name].package) else None


@pytest.fixture(scope="session", params=["smollm2-135m", "gemma3-270m"])
def converted(request, tmp_path_factory) -> tuple[Path, Path, Path]:
    """(the GGUF, its float32 checkpoint, its bfloat16 checkpoint), converted once a session."""
    gguf = _gguf(request.param)
    if gguf is None:
        pytest.skip(f"{request.param} is not installed")
    root = tmp_path_factory.mktemp(request.param)
    dirs = {torch.float32: root / "float32", torch.bfloat16: root / "bfloat16"}
    convert_gguf(gguf, dirs)
    return gguf, dirs[torch.float32], dirs[torch.bfloat16]


def engine_on(path: Path, **settings) -> Engine:
    return Engine(EngineConfig(model_path=path, device="cpu", max_batch=4, num_threads=1, **settings))


def run(engine: Engine, prompts: dict[str, list[int]], params: SamplingParams) -> dict[str, np.ndarray]:
    out = engine.generate({rid: (ids, params) for rid, ids in prompts.items()})
    return {rid: as_array([r for d in deltas for r in d.records]) for rid, deltas in out.items()}


def test_the_float32_checkpoint_gives_the_gguf_bits(converted):
    gguf, f32, _ = converted
    ours, theirs = engine_on(f32), engine_on(gguf, weights="float32")
    tok = theirs.tokenizer
    prompts = {str(i): tok.encode(t, add_bos=tok.ids.add_bos) for i, t in enumerate(TEXTS)}
    for params in (GREEDY, SAMPLED):
        together = run(ours, prompts, params)
        assert all(np.array_equal(together[rid], run(theirs, prompts, params)[rid]) for rid in prompts)
        for rid, ids in list(prompts.items())[:2]:
            assert np.array_equal(run(ours, {rid: ids}, params)[rid], together[rid])


def test_the_float32_checkpoint_matches_transformers(converted):
    from transformers import AutoTokenizer

    _, f32, _ = converted
    engine, theirs = engine_on(f32), AutoTokenizer.from_pretrained(f32)
    for text in TEXTS:
        assert engine.tokenizer.encode(text, add_bos=engine.tokenizer.ids.add_bos) == theirs(text).input_ids
    ids = engine.tokenizer.encode(TEXTS[0], add_bos=engine.tokenizer.ids.add_bos)
    out = engine.generate({"a": (ids, GREEDY)})["a"]
    records = [r for d in out for r in d.records]
    greedy_check(records, reference_logprobs(f32, ids + [r.token_id for r in records]), len(ids))


def test_the_bfloat16_checkpoint_serves_batch_invariant(converted):
    _, f32, bf16 = converted
    engine = engine_on(bf16)
    assert engine.model.weights_nbytes < 0.6 * engine_on(f32).model.weights_nbytes  # BF16 kept as BF16
    tok = engine.tokenizer
    prompts = {str(i): tok.encode(t, add_bos=tok.ids.add_bos) for i, t in enumerate(TEXTS)}
    together = run(engine, prompts, GREEDY)
    for rid, ids in prompts.items():
        assert np.array_equal(run(engine, {rid: ids}, GREEDY)[rid], together[rid])


def test_swap_time(converted, capsys):
    """load_weights' work on a real model: float32 served, the bfloat16 copy swapped in (and the
    figures printed for docs/hf-checkpoints.md)."""
    _, f32, bf16 = converted
    engine = engine_on(f32)
    for path in (bf16, f32):
        started = time.perf_counter()
        prepared = engine.prepare_weights(path)
        engine.install_weights(prepared)
        with capsys.disabled():
            print(f"\n{path}: read and built in {prepared.load_s:.2f} s, swapped in "
                  f"{time.perf_counter() - started - prepared.load_s:.4f} s")
    tok = engine.tokenizer
    ids = tok.encode(TEXTS[0], add_bos=tok.ids.add_bos)
    assert np.array_equal(run(engine, {"a": ids}, GREEDY)["a"], run(engine_on(f32), {"a": ids}, GREEDY)["a"])
