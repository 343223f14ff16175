"""A keep-mode weight swap mid-generation (docs/weight-versions.md): every running sequence feeds
its whole prefix again under the new weights and goes on. Each token's logprob equals the
re-scoring of its prefix under the weights its span names, bit for bit: before the swap the old
ones, after it the new ones; greedy and seeded, alone and in a batch (of 16 on the default
model), on a tiny GGUF pair, on both packaged models (each file with its output norm scaled: a
second file of the same shapes) and on a pair of tiny Hugging Face checkpoints."""

import shutil

import gguf
import numpy as np
import pytest

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.known_models import resolve_model
from batchproof.engine.outputs import VersionSpan
from batchproof.engine.sampling.params import SamplingParams
from batchproof.engine.weight_versions import default_version, spans
from tests.helpers.second_model import gemma_package  # noqa: F401 (a fixture)

PROMPTS = ["hello the world", "and then 123 more", "the hell and", "in an and"]
NUM_TOKENS = 16
SWAP_AT = 3  # the swap comes once a sequence has this many tokens (the batch's last may still prefill)


def params(kind: str, seed: int = 7) -> SamplingParams:
    sampled = {"temperature": 0.9, "seed": seed} if kind == "seeded" else {"temperature": 0}
    return SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True, top_logprobs=1, **sampled)


def run_with_swap(engine: Engine, prompts: list[list[int]], kind: str, prepared, version: str) -> dict:
    """Each request's (token ids, logprobs, spans), the swap installed mid-generation."""
    for i, ids in enumerate(prompts):
        engine.add_request(f"r{i}", ids, params(kind, seed=7 + i))
    deltas: dict[str, list] = {f"r{i}": [] for i in range(len(prompts))}
    while max((len(s.output_ids) for s in engine.scheduler.running), default=0) < SWAP_AT:
        for out in engine.step():
            deltas[out.request_id].append(out)
    engine.install_weights(prepared, version, keep=True)
    while engine.has_work():
        for out in engine.step():
            deltas[out.request_id].append(out)
    engine.take_batch_summary()
    result = {}
    for request_id, outs in deltas.items():
        assert outs[-1].finish_reason == "length", outs[-1]
        token_ids = [t for o in outs for t in o.token_ids]
        logprobs = [r.logprob for o in outs for r in o.records]
        result[request_id] = (token_ids, logprobs, joined([s for o in outs for s in o.weight_version_spans]))
    return result


def joined(found: list[VersionSpan]) -> list[VersionSpan]:
    """The deltas' spans end to end (each delta's begins where the last one's ended), a version's joined."""
    merged: list[VersionSpan] = []
    for span in found:
        assert span.start == (merged[-1].end if merged else 0)
        if merged and merged[-1].version == span.version:
            merged[-1] = VersionSpan(merged[-1].start, span.end, span.version)
        else:
            merged.append(span)
    return merged


def rescored(engine: Engine, prompt: list[int], reply: list[int]) -> list[float]:
    """The reply's tokens' logprobs, scored as one prompt (max_tokens 0): every position afresh."""
    out = engine.generate({"score": (prompt + reply, SamplingParams(max_tokens=0, prompt_logprobs=0,
                                                                    cache_namespace=None))})["score"]
    return [r.logprob for r in out[0].prompt_records[len(prompt):]]


def chat_prompts(engine: Engine, batch: int) -> list[list[int]]:
    """`batch` chat prompts: PROMPTS in turn, each numbered (so no two are the same)."""
    return [engine.chat_prompt_ids([{"role": "user", "content": f"{PROMPTS[i % len(PROMPTS)]} {i}"}])
            for i in range(batch)]


def scaled_copy(served, directory):
    """The file with its output norm scaled by 1.25: other numbers, the same shapes."""
    changed = directory / "changed.gguf"
    shutil.copyfile(served, changed)
    reader = gguf.GGUFReader(changed, "r+")
    norm = next(t for t in reader.tensors if t.name == "output_norm.weight")
    norm.data[:] = (norm.data * np.float32(1.25)).astype(norm.data.dtype)
    reader.data.flush()
    return served, changed


def check_swap(pair: "Pair", prompts: list[list[int]], kind: str) -> None:
    """Swap mid-generation, then hold each token against re-scoring under its span's weights."""
    old_version = pair.swapped.weight_version
    results = run_with_swap(pair.swapped, prompts, kind, pair.prepared, "step-2")
    num_mixed = 0
    for i, ids in enumerate(prompts):
        token_ids, logprobs, found = results[f"r{i}"]
        assert len(token_ids) == len(logprobs) == NUM_TOKENS
        cut = found[0].end if found[0].version == old_version else 0
        # The spans cover the reply end to end: the old weights' first (if they chose any), then the new.
        assert found == [s for s in (VersionSpan(0, cut, old_version), VersionSpan(cut, NUM_TOKENS, "step-2"))
                         if s.start < s.end]
        num_mixed += 0 < cut < NUM_TOKENS
        under_old = rescored(pair.old, ids, token_ids)
        under_new = rescored(pair.new, ids, token_ids)
        assert logprobs[:cut] == under_old[:cut]
        assert logprobs[cut:] == under_new[cut:]
        assert under_old[cut:] != under_new[cut:]  # the swap changed the numbers
    assert num_mixed  # at least one reply was cut by the swap
    pair.swap_back()


class Pair:
    """An engine to swap, and two that stay: on the old weights and on the new (idle between tests)."""

    def __init__(self, old_path, new_path, max_batch: int = 4, max_prefill_tokens: int = 8) -> None:
        config = {"device": "cpu", "max_batch": max_batch, "num_threads": 1, "max_prefill_tokens": max_prefill_tokens}
        self.old_path, self.new_path = old_path, new_path
        self.swapped = Engine(EngineConfig(model_path=old_path, **config))
        self.old = Engine(EngineConfig(model_path=old_path, **config))
        self.new = Engine(EngineConfig(model_path=new_path, **config))
        self.prepared = self.swapped.prepare_weights(new_path)

    def swap_back(self) -> None:
        """The old weights again (idle: a drain swap), for the next test."""
        self.swapped.install_weights(self.swapped.prepare_weights(self.old_path))
        self.prepared = self.swapped.prepare_weights(self.new_path)


@pytest.fixture(scope="module")
def tiny(tiny_pair) -> Pair:
    return Pair(*tiny_pair)


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
@pytest.mark.parametrize("batch", [1, 4])
def test_tiny_keep_swap_matches_rescoring_on_each_side(tiny, kind, batch):
    prompts = [tiny.swapped.tokenizer.encode(p, add_bos=False) for p in PROMPTS[:batch]]
    check_swap(tiny, prompts, kind)


def test_the_default_version_is_the_served_files_hash(tiny_pair):
    engine = Engine(EngineConfig(model_path=tiny_pair[0], device="cpu", max_batch=1))
    assert engine.weight_version == default_version(engine.model_sha256) == engine.model_sha256[:16]
    engine.install_weights(engine.prepare_weights(tiny_pair[1]))  # idle: a drain swap, no label given
    assert engine.weight_version == engine.model_sha256[:16] != default_version(Engine(
        EngineConfig(model_path=tiny_pair[0], device="cpu", max_batch=1)).model_sha256)


def test_a_drain_swap_refuses_while_work_runs(tiny_pair):
    engine = Engine(EngineConfig(model_path=tiny_pair[0], device="cpu", max_batch=1))
    engine.add_request("r", [1, 2, 3], params("greedy"))
    with pytest.raises(RuntimeError, match="no sequence runs or waits"):
        engine.install_weights(engine.prepare_weights(tiny_pair[1]))
    engine.abort("r")
    engine.step()
    assert not engine.has_work()


def test_no_old_key_reaches_the_new_prefix_cache(tiny):
    """A request after a keep swap, sharing a running one's prompt, gets the same bits as on a
    fresh engine on the new weights: nothing the old weights computed was reused."""
    swapped, new, prepared = tiny.swapped, tiny.new, tiny.prepared
    prompt = swapped.tokenizer.encode("hello the world and then the world hello " * 3, add_bos=False)
    swapped.add_request("a", prompt, params("greedy"))
    for _ in range(4):
        swapped.step()
    swapped.install_weights(prepared, keep=True)
    while swapped.has_work():
        swapped.step()
    after = swapped.generate({"b": (prompt, SamplingParams(max_tokens=8, top_logprobs=1, temperature=0,
                                                           prompt_logprobs=0))})["b"]
    fresh = new.generate({"b": (prompt, SamplingParams(max_tokens=8, top_logprobs=1, temperature=0,
                                                       prompt_logprobs=0))})["b"]
    assert [r.logprob for o in after for r in o.records] == [r.logprob for o in fresh for r in o.records]
    assert [r.logprob for r in after[0].prompt_records[1:]] == [r.logprob for r in fresh[0].prompt_records[1:]]
    assert after[0].num_cached_tokens > 0  # it did reuse: the blocks the refilled sequence left
    tiny.swap_back()


def test_spans_from_marks():
    marks = [(0, "a"), (3, "b"), (3, "c"), (5, "d")]
    assert spans(marks, 0, 7) == [VersionSpan(0, 3, "a"), VersionSpan(3, 5, "c"), VersionSpan(5, 7, "d")]
    assert spans(marks, 4, 6) == [VersionSpan(4, 5, "c"), VersionSpan(5, 6, "d")]
    assert spans(marks, 2, 2) == []


@pytest.fixture(scope="module")
def default_pair(tmp_path_factory):
    """The default model's file, and a copy with its output norm scaled (same shapes, other weights)."""
    return scaled_copy(resolve_model(None), tmp_path_factory.mktemp("default-swap"))


@pytest.fixture(scope="module")
def default(default_pair) -> Pair:
    return Pair(*default_pair, max_batch=16, max_prefill_tokens=16)


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
@pytest.mark.parametrize("batch", [1, 16])
def test_default_model_keep_swap(default, kind, batch):
    check_swap(default, chat_prompts(default.swapped, batch), kind)


@pytest.fixture(scope="module")
def gemma(gemma_package, tmp_path_factory) -> Pair:  # noqa: F811 (the fixture imported above)
    """The second packaged model (Gemma 3 270M, Q4_K_M) and its scaled copy."""
    return Pair(*scaled_copy(resolve_model("gemma3-270m"), tmp_path_factory.mktemp("gemma-swap")),
                max_prefill_tokens=16)


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_gemma_keep_swap(gemma, kind):
    prompts = [gemma.swapped.tokenizer.encode(p, add_bos=True) for p in PROMPTS]  # a base model: no template
    check_swap(gemma, prompts, kind)


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    """Two tiny Hugging Face checkpoints of one llama (seeds 0 and 1: a trainer's two steps)."""
    pytest.importorskip("transformers")
    from tests.hf.checkpoints import tiny_model, write_checkpoint

    root = tmp_path_factory.mktemp("hf-swap")
    return [write_checkpoint(tiny_model("llama", seed), root / f"llama-{seed}", "llama") for seed in (0, 1)]


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_hf_checkpoint_keep_swap(hf_pair, kind):
    pair = Pair(*hf_pair)
    prompts = [pair.swapped.tokenizer.encode(p, add_bos=False) for p in PROMPTS]
    check_swap(pair, prompts, kind)
