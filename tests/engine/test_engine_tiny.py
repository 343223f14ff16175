"""Tiny random llama / qwen2 / qwen3 / gemma3 models through the whole engine, against a naive float64 forward."""

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from batchproof.engine.cache.kv_cache import KVCache
from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.errors import ModelLoadError
from batchproof.engine.model.ops import KernelOps, TorchOps
from batchproof.engine.model.transformer import Segment
from batchproof.engine.sampling.params import SamplingParams
from tests.helpers.tiny_gguf import TinySpec, reference_logits, write_tiny_gguf

Q = gguf.GGMLQuantizationType
SPECS = {
    "llama": TinySpec("llama"),
    "qwen2": TinySpec("qwen2", pre="qwen2", seed=1),
    "qwen3": TinySpec("qwen3", head_dim=24, pre="qwen2", seed=2),
    "llama-tied-mha": TinySpec("llama", tie_embeddings=True, num_kv_heads=4, seed=3),
    # a Llama 2 / TinyLlama / Mistral-style file: llama with a SentencePiece vocabulary
    "llama-sentencepiece": TinySpec("llama", tokenizer="llama", seed=6),
    # six layers: five local ones (a window of 4, cut in by every prompt here) and a global one;
    # head_dim 64 takes the attention kernels' vector paths
    "gemma3": TinySpec("gemma3", num_layers=6, num_heads=2, num_kv_heads=1, head_dim=64, rope_base=1e6,
                       norm_eps=1e-6, tie_embeddings=True, sliding_window=4, seed=4),
}
MESSAGES = [{"role": "user", "content": "hello the world, and then 123 more!"}]


class Tiny:
    def __init__(self, directory: Path, name: str, spec: TinySpec, weights: dict | None = None) -> None:
        self.spec = spec
        self.path = directory / f"{name}.gguf"
        self.weights = write_tiny_gguf(self.path, spec, weights)
        self.engine = Engine(EngineConfig(model_path=self.path, device="cpu", max_batch=4))
        self.prompt = self.engine.chat_prompt_ids(MESSAGES)

    def reference(self, ids: list[int]) -> torch.Tensor:
        return reference_logits(self.spec, self.weights, ids)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="module", params=list(SPECS))
def tiny(request, tiny_dir: Path) -> Tiny:
    return Tiny(tiny_dir, request.param, SPECS[request.param])


def fresh_cache(engine: Engine, slots: int = 4, max_len: int = 96) -> KVCache:
    s = engine.spec
    return KVCache(s.num_layers, slots, s.num_kv_heads, max_len, s.head_dim, torch.device("cpu"), torch.float32)


@torch.inference_mode()
def prefill_logits(engine: Engine, ids: list[int], cache: KVCache | None = None, slot: int = 0) -> torch.Tensor:
    cache = cache or fresh_cache(engine)
    return engine.model.logits(engine.model.prefill([Segment(torch.tensor(ids), 0, slot)], cache))


def assert_close(ours: torch.Tensor, reference: torch.Tensor, tol: float = 1e-4) -> None:
    scale = max(1.0, float(reference.abs().max()))
    diff = float((ours.double() - reference.double()).abs().max())
    assert diff <= tol * scale, f"max |diff| {diff:.3g} > {tol * scale:.3g}"


def test_prefill_logits_match_the_float64_reference(tiny: Tiny) -> None:
    assert_close(prefill_logits(tiny.engine, tiny.prompt), tiny.reference(tiny.prompt))


@torch.inference_mode()
def test_cached_decode_equals_one_full_prefill(tiny: Tiny) -> None:
    model, ids = tiny.engine.model, tiny.prompt
    full = prefill_logits(tiny.engine, ids)[-1]
    cache = fresh_cache(tiny.engine)
    model.prefill([Segment(torch.tensor(ids[:3]), 0, 2)], cache)
    for pos in range(3, len(ids)):
        hidden = model.decode(torch.tensor([ids[pos]]), torch.tensor([pos]), torch.tensor([2]), 1, cache)
    assert_close(model.logits(hidden)[0], full)
    # a prompt prefilled in chunks of 5 (a later chunk attends to the cached earlier ones)
    chunked = fresh_cache(tiny.engine)
    for start in range(0, len(ids), 5):
        hidden = model.prefill([Segment(torch.tensor(ids[start:start + 5]), start, 1)], chunked)
    assert_close(model.logits(hidden)[-1], full)


def greedy(engine: Engine, prompt: list[int], max_tokens: int = 6, top_logprobs: int = 3, **kw) -> list:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, top_logprobs=top_logprobs, ignore_eos=True, **kw)
    return engine.generate({"r": (prompt, params)})["r"]


def test_generation_runs_and_every_record_matches_a_full_recompute(tiny: Tiny) -> None:
    deltas = greedy(tiny.engine, tiny.prompt)
    records = [r for d in deltas for r in d.records]
    ids = [r.token_id for r in records]
    assert deltas[-1].finish_reason == "length" and deltas[-1].num_output_tokens == 6 and len(ids) == 6
    assert "".join(d.text for d in deltas) == tiny.engine.tokenizer.decode(ids)
    assert not tiny.engine.has_work()
    reference = torch.log_softmax(tiny.reference(tiny.prompt + ids[:-1]), -1)[len(tiny.prompt) - 1:]
    for step, record in enumerate(records):
        row = reference[step]
        assert abs(record.logprob - float(row[record.token_id])) <= 1e-4, step
        best = row.topk(2)
        if float(best.values[0] - best.values[1]) > 1e-3:  # no near-tie: the argmax is certain
            assert record.token_id == int(best.indices[0]), step
        for entry in record.top:
            assert abs(entry.logprob - float(row[entry.token_id])) <= 1e-4


def test_a_sampled_request_runs_and_reproduces(tiny: Tiny) -> None:
    params = SamplingParams(temperature=1.0, seed=7, max_tokens=8, top_logprobs=2, ignore_eos=True)
    first = tiny.engine.generate({"a": (tiny.prompt, params)})["a"]
    second = tiny.engine.generate({"a": (tiny.prompt, params)})["a"]
    assert [r for d in first for r in d.records] == [r for d in second for r in d.records]
    assert len([r for d in first for r in d.records]) == 8


def test_decoding_together_equals_decoding_alone(tiny: Tiny) -> None:
    prompts = [tiny.prompt, tiny.prompt[:9], tiny.engine.chat_prompt_ids([{"role": "user", "content": "in"}])]
    alone = [[r for d in greedy(tiny.engine, p) for r in d.records] for p in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=6, top_logprobs=3, ignore_eos=True)
    together = tiny.engine.generate({str(i): (p, params) for i, p in enumerate(prompts)})
    for i in range(len(prompts)):
        assert [r for d in together[str(i)] for r in d.records] == alone[i]


@torch.inference_mode()
def test_the_torch_path_agrees_with_our_kernels(tiny: Tiny) -> None:
    model = tiny.engine.model
    if not isinstance(model.ops, KernelOps):
        pytest.skip("kernels not built here")
    ids = tiny.prompt

    def last_two(ops) -> torch.Tensor:
        model.ops = ops
        cache = fresh_cache(tiny.engine)
        model.prefill([Segment(torch.tensor(ids[:-2]), 0, 0)], cache)
        model.prefill([Segment(torch.tensor(ids[:-1]), 0, 1)], cache)
        hidden = model.decode(torch.tensor([ids[-2], ids[-1]]), torch.tensor([len(ids) - 2, len(ids) - 1]),
                              torch.tensor([0, 1]), 2, cache)
        return model.logits(hidden)

    kernel_ops = model.ops
    try:
        ours, torch_path = last_two(kernel_ops), last_two(TorchOps(padded=True))
    finally:
        model.ops = kernel_ops
    assert_close(ours, torch_path, tol=1e-5)


@torch.inference_mode()
def test_the_fused_decode_step_is_bitwise_the_op_by_op_step(tiny: Tiny) -> None:
    """All layers in one C call against the same kernels called one by one from Python:
    the same KV cache contents and the same hidden states, bit for bit (every architecture here is fused:
    qwen3's Q/K norms; gemma3's post-norms, GELU, windows cut in by every prompt, two RoPE tables)."""
    model = tiny.engine.model
    if not isinstance(model.ops, KernelOps):
        pytest.skip("kernels not built here")
    ids = tiny.prompt

    def step(fused: bool) -> tuple[torch.Tensor, ...]:
        model.ops.is_fused = fused
        cache = fresh_cache(tiny.engine)
        for slot, n in enumerate((len(ids) - 3, len(ids) - 1, 4)):
            model.prefill([Segment(torch.tensor(ids[:n]), 0, slot)], cache)
        positions = torch.tensor([len(ids) - 3, len(ids) - 1, 4])
        hidden = model.decode(torch.tensor([ids[-3], ids[-1], ids[4]]), positions, torch.tensor([0, 1, 2]), 3, cache)
        written = [(c[:, slot, :, :int(n) + 1].clone()) for c in (cache.k, cache.v) for slot, n in enumerate(positions)]
        return hidden, *written

    try:
        fused, op_by_op = step(True), step(False)
    finally:
        model.ops.is_fused = True
    for a, b in zip(fused, op_by_op):
        assert torch.equal(a, b)


# --- weights that must take effect: qwen2 biases, qwen3 q/k norms; quantized storage ----------


def variant(tiny_dir: Path, name: str, spec: TinySpec, change) -> tuple[Tiny, Tiny]:
    base = Tiny(tiny_dir, name + "-base", spec)
    weights = {k: v.copy() for k, v in base.weights.items()}
    for key in weights:
        change(key, weights[key])
    return base, Tiny(tiny_dir, name + "-changed", spec, weights)


def zero_biases(key: str, array: np.ndarray) -> None:
    if key.endswith(".bias"):
        array[...] = 0.0


def zero_qk_norms(key: str, array: np.ndarray) -> None:
    if key.endswith(("attn_q_norm.weight", "attn_k_norm.weight")):
        array[...] = 0.0


@pytest.mark.parametrize("name,spec,change", [
    ("qwen2-biases", SPECS["qwen2"], zero_biases),
    ("qwen3-qk-norm", SPECS["qwen3"], zero_qk_norms),
])
def test_biases_and_qk_norms_take_effect(tiny_dir: Path, name: str, spec: TinySpec, change) -> None:
    base, changed = variant(tiny_dir, name, spec, change)
    ours_base, ours_changed = prefill_logits(base.engine, base.prompt), prefill_logits(changed.engine, base.prompt)
    assert float((ours_base - ours_changed).abs().max()) > 1e-2, "the tensors were ignored"
    assert_close(ours_base, base.reference(base.prompt))
    assert_close(ours_changed, changed.reference(base.prompt))


def test_f16_and_q8_0_models_run_and_match_the_reference_on_the_stored_values(tiny_dir: Path) -> None:
    types = {"token_embd.weight": Q.F16, "output.weight": Q.Q8_0, "blk.0.attn_q.weight": Q.Q8_0,
             "blk.1.ffn_down.weight": Q.Q8_0, "blk.1.attn_k.weight": Q.F16}
    spec = TinySpec("llama", seed=5, tensor_types=types)
    tiny = Tiny(tiny_dir, "mixed", spec)
    stored = {}
    for name, array in tiny.weights.items():  # row-wise quantization commutes with llama's row permutation
        qtype = types.get(name, Q.F32)
        if qtype == Q.F16:
            stored[name] = array.astype(np.float16).astype(np.float32)
        elif qtype == Q.Q8_0:
            stored[name] = gguf.quants.dequantize(gguf.quants.quantize(array, qtype), qtype).reshape(array.shape)
        else:
            stored[name] = array
    assert_close(prefill_logits(tiny.engine, tiny.prompt), reference_logits(spec, stored, tiny.prompt))
    deltas = greedy(tiny.engine, tiny.prompt, max_tokens=4)
    assert deltas[-1].finish_reason == "length" and deltas[-1].num_output_tokens == 4


def test_an_unreadable_tensor_type_fails_the_engine_load_naming_the_tensor(tiny_dir: Path) -> None:
    path = tiny_dir / "unreadable.gguf"
    write_tiny_gguf(path, TinySpec(tensor_types={"blk.0.ffn_up.weight": Q.Q8_1}))
    with pytest.raises(ModelLoadError) as caught:
        Engine(EngineConfig(model_path=path, device="cpu", max_batch=1))
    message = str(caught.value)
    assert str(path) in message and "blk.0.ffn_up.weight" in message and "Q8_1" in message
    assert "\n" not in message


# --- NaN and -inf logits, and prompts the engine cannot run ------------------------------------


def poison_decode(engine: Engine, monkeypatch, request_id: str, at_step: int, fill) -> None:
    """Let `fill` edit the decode logits of one request at one step (a model that produced NaN)."""
    original = engine.runner.decode

    def decode(seqs):
        logits = original(seqs)
        for row, seq in enumerate(seqs):
            if seq.request_id == request_id and len(seq.output_ids) == at_step:
                fill(logits[row])
        return logits

    monkeypatch.setattr(engine.runner, "decode", decode)


def records_of(deltas) -> list:
    return [r for d in deltas for r in d.records]


def test_an_all_nan_step_fails_only_its_request_and_names_the_step(tiny_dir: Path, monkeypatch) -> None:
    tiny = Tiny(tiny_dir, "nan", SPECS["llama"])
    params = SamplingParams(temperature=0.0, max_tokens=6, top_logprobs=2, ignore_eos=True)
    other_prompt = tiny.engine.chat_prompt_ids([{"role": "user", "content": "and the"}])
    alone = records_of(tiny.engine.generate({"good": (other_prompt, params)})["good"])
    poison_decode(tiny.engine, monkeypatch, "bad", 2, lambda row: row.fill_(float("nan")))
    out = tiny.engine.generate({"bad": (tiny.prompt, params), "good": (other_prompt, params)})
    assert out["bad"][-1].finish_reason == "error" and "step 2" in out["bad"][-1].error
    assert [r.step for r in records_of(out["bad"])] == [0, 1][:len(records_of(out["bad"]))]
    assert sum(d.finish_reason is not None for d in out["bad"]) == 1
    assert records_of(out["good"]) == alone and out["good"][-1].finish_reason == "length"
    assert not tiny.engine.has_work()


def test_a_nan_logit_is_never_chosen_nor_ranked(tiny_dir: Path, monkeypatch) -> None:
    tiny = Tiny(tiny_dir, "nan-some", SPECS["qwen2"])
    clean = records_of(greedy(tiny.engine, tiny.prompt, max_tokens=3, top_logprobs=8))
    best = clean[1].top[0].token_id
    poisoned_ids = [best, *range(0, 256, 3)]
    poison_decode(tiny.engine, monkeypatch, "r", 1, lambda row: row.index_fill_(0, torch.tensor(poisoned_ids),
                                                                                   float("nan")))
    with_records = records_of(greedy(tiny.engine, tiny.prompt, max_tokens=3, top_logprobs=5))
    record = with_records[1]
    survivors = [e.token_id for e in clean[1].top if e.token_id not in poisoned_ids]
    assert record.token_id == survivors[0] != best
    assert [e.token_id for e in record.top][:len(survivors)] == survivors[:5]
    assert not set(e.token_id for e in record.top) & set(poisoned_ids)
    assert record.logprob > clean[1].top[[e.token_id for e in clean[1].top].index(survivors[0])].logprob
    without = greedy(tiny.engine, tiny.prompt, max_tokens=3, top_logprobs=None)
    assert "".join(d.text for d in without) == tiny.engine.tokenizer.decode([r.token_id for r in with_records])


def test_minus_inf_logits_rank_last_with_minus_inf_logprob(tiny_dir: Path, monkeypatch) -> None:
    tiny = Tiny(tiny_dir, "minus-inf", SPECS["llama"])
    keep = [5, 77, 260]

    def fill(row: torch.Tensor) -> None:
        mask = torch.ones_like(row, dtype=torch.bool)
        mask[keep] = False
        row.masked_fill_(mask, float("-inf"))

    poison_decode(tiny.engine, monkeypatch, "r", 1, fill)
    record = records_of(greedy(tiny.engine, tiny.prompt, max_tokens=2, top_logprobs=5))[1]
    assert record.token_id in keep
    assert sorted(e.token_id for e in record.top[:3]) == keep
    assert [e.token_id for e in record.top[3:]] == [0, 1], "then the -inf ones, lower id first"
    assert all(e.logprob == float("-inf") for e in record.top[3:])
    assert abs(sum(torch.tensor([e.logprob for e in record.top[:3]]).double().exp().tolist()) - 1) < 1e-5


@pytest.mark.parametrize("prompt_len", [0, 40])
def test_a_prompt_the_engine_cannot_run_fails_alone(tiny_dir: Path, prompt_len: int) -> None:
    spec = TinySpec("llama", context_len=32, seed=9)
    path = tiny_dir / f"ctx32-{prompt_len}.gguf"
    write_tiny_gguf(path, spec)
    engine = Engine(EngineConfig(model_path=path, device="cpu", max_batch=2))
    params = SamplingParams(temperature=0.0, max_tokens=3, top_logprobs=1, ignore_eos=True)
    alone = records_of(engine.generate({"good": ([97, 98, 99], params)})["good"])
    try:
        engine.add_request("bad", [97] * prompt_len, params)
    except ValueError as e:  # refusing it up front, naming the lengths, is fine too
        assert str(prompt_len) in str(e)
        refused = True
    else:
        refused = False
    engine.add_request("good", [97, 98, 99], params)
    outputs = {"bad": [], "good": []}
    while engine.has_work():
        for out in engine.step():
            outputs[out.request_id].append(out)
    assert records_of(outputs["good"]) == alone
    if not refused:
        assert outputs["bad"][-1].finish_reason == "error"


def test_an_infinite_logit_gives_the_same_reply_with_and_without_records(tiny_dir: Path, monkeypatch) -> None:
    tiny = Tiny(tiny_dir, "plus-inf", SPECS["llama"])
    poison_decode(tiny.engine, monkeypatch, "r", 1, lambda row: row.__setitem__(42, float("inf")))
    without = greedy(tiny.engine, tiny.prompt, max_tokens=3, top_logprobs=None)
    with_records = greedy(tiny.engine, tiny.prompt, max_tokens=3, top_logprobs=2)
    assert without[-1].finish_reason == "length"
    assert with_records[-1].finish_reason == without[-1].finish_reason
    assert records_of(with_records)[1].token_id == 42 and records_of(with_records)[1].logprob == 0.0
