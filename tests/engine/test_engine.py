"""The engine on the real default model: the float32 reference, end of generation, stop strings,
reproducibility, records that change nothing, and batch invariance."""

import json
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from batchproof.engine.cache.kv_cache import KVCache
from batchproof.engine.engine import Engine
from batchproof.engine.model.transformer import Segment
from batchproof.engine.outputs import RequestOutput
from batchproof.engine.sampling.logprobs import TokenRecord
from batchproof.engine.sampling.params import SamplingParams

REFERENCE = json.loads((Path(__file__).parent / "reference" / "hf_reference.json").read_text())
FRANCE = "What is the capital of France?"
EOS_ID = 2  # <|im_end|>
# float32 here and in transformers, summed in different orders: the largest gap seen is 2.2e-5.
HF_TOLERANCE = 1e-4


@dataclass
class Run:
    output_ids: list[int]
    deltas: list[RequestOutput]

    @property
    def records(self) -> list[TokenRecord]:
        return [r for d in self.deltas for r in d.records]

    @property
    def text(self) -> str:
        return "".join(d.text for d in self.deltas)

    @property
    def last(self) -> RequestOutput:
        return self.deltas[-1]


def run(engine: Engine, requests: dict[str, tuple[list[int], SamplingParams]],
        join_later: dict[str, tuple[list[int], SamplingParams]] | None = None, join_after_steps: int = 0
        ) -> dict[str, Run]:
    """Steps the engine until idle; also returns each request's generated ids, EOS excluded
    (read from the engine's sequence, so they are known even without records)."""
    seqs, deltas = {}, {}

    def add(batch: dict) -> None:
        for request_id, (prompt_ids, params) in batch.items():
            engine.add_request(request_id, prompt_ids, params)
            seqs[request_id] = engine._sequences[request_id]
            deltas[request_id] = []

    add(requests)
    steps = 0
    while engine.has_work() or join_later:
        if join_later and steps == join_after_steps:
            add(join_later)
            join_later = None
        for out in engine.step():
            deltas[out.request_id].append(out)
        steps += 1
    engine.take_batch_summary()
    assert not engine.has_work()
    return {rid: Run(list(seqs[rid].output_ids), deltas[rid]) for rid in seqs}


def run_one(engine: Engine, prompt_ids: list[int], params: SamplingParams) -> Run:
    return run(engine, {"one": (prompt_ids, params)})["one"]


def chat(engine: Engine, text: str) -> list[int]:
    return engine.chat_prompt_ids([{"role": "user", "content": text}])


def greedy(**kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, **kw)


# --- the Hugging Face float32 reference --------------------------------------------------------


def test_greedy_ids_and_logprobs_match_hugging_face(engine: Engine) -> None:
    cases = REFERENCE["chat"]
    assert len(cases) >= 5 and all(len(c["steps"]) >= 32 for c in cases)
    requests = {}
    for i, case in enumerate(cases):
        prompt_ids = chat(engine, case["prompt"])
        assert prompt_ids == case["prompt_ids"]
        requests[str(i)] = (prompt_ids, greedy(max_tokens=len(case["steps"]), top_logprobs=5))
    runs = run(engine, requests)  # all six decode together: the batch must not matter either
    for i, case in enumerate(cases):
        records = runs[str(i)].records
        steps = [s for s in case["steps"] if s["id"] != EOS_ID]
        assert [r.token_id for r in records] == [s["id"] for s in steps], case["prompt"]
        for n, (record, step) in enumerate(zip(records, steps)):
            where = (case["prompt"], n)
            assert abs(record.logprob - step["logprob"]) <= HF_TOLERANCE, where
            # the same five alternatives in the same order, each within the tolerance
            assert [e.token_id for e in record.top] == step["top_ids"], where
            for entry, reference in zip(record.top, step["top_logprobs"]):
                assert abs(entry.logprob - reference) <= HF_TOLERANCE, where


@torch.inference_mode()
def test_cached_decode_equals_full_prefill_on_the_real_model(engine: Engine) -> None:
    prompt = chat(engine, FRANCE)
    result = run_one(engine, prompt, greedy(max_tokens=6, top_logprobs=1))
    ids = result.output_ids
    s = engine.spec
    for n in (0, 3, 5):  # record n was read from decode logits after n cached steps
        cache = KVCache(s.num_layers, 1, s.num_kv_heads, 64, s.head_dim, torch.device("cpu"), torch.float32)
        full = engine.model.logits(engine.model.prefill([Segment(torch.tensor(prompt + ids[:n]), 0, 0)], cache))[-1]
        logprobs = torch.log_softmax(full.double(), -1)
        assert abs(result.records[n].logprob - float(logprobs[ids[n]])) <= 1e-4
        assert int(full.argmax()) == ids[n]


# --- reproducibility; asking for records changes nothing ---------------------------------------


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0, max_tokens=8),
    SamplingParams(temperature=1.3, seed=7, top_k=40, top_p=0.9, min_p=0.02, max_tokens=8),
    SamplingParams(temperature=0.8, seed=3, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.5,
                   max_tokens=8),
], ids=["greedy", "sampled-top-k-p-min-p", "sampled-penalties"])
def test_same_tokens_twice_and_with_or_without_records(engine: Engine, params: SamplingParams) -> None:
    prompt = chat(engine, "Tell me a story about a dragon.")
    top_ns = (None, 0, 5, 20) if params.is_greedy else (None, 5)
    runs = {n: run_one(engine, prompt, replace(params, top_logprobs=n)) for n in top_ns}
    again = run_one(engine, prompt, replace(params, top_logprobs=5))
    base = runs[None]
    assert len(base.output_ids) > 0 and base.records == []
    for n, other in runs.items():
        assert other.output_ids == base.output_ids, f"top_logprobs={n} changed a token"
        assert other.text == base.text and other.last.finish_reason == base.last.finish_reason
        assert other.last.num_output_tokens == base.last.num_output_tokens
    assert again.output_ids == base.output_ids and again.records == runs[5].records
    assert [r.token_id for r in runs[5].records] == base.output_ids
    if params.is_greedy:
        assert all(r.top == () for r in runs[0].records)
        assert [r.logprob for r in runs[0].records] == [r.logprob for r in runs[20].records]
        assert [r.top[:5] for r in runs[20].records] == [r.top for r in runs[5].records]


def test_records_read_the_logits_before_temperature(engine: Engine) -> None:
    """Step 0 of a sampled request reads the same logits as a greedy one: the same records."""
    prompt = chat(engine, FRANCE)
    greedy_first = run_one(engine, prompt, greedy(max_tokens=1, top_logprobs=5)).records[0]
    sampled_first = run_one(engine, prompt, SamplingParams(temperature=1.7, seed=5, max_tokens=1,
                                                           top_logprobs=5)).records[0]
    assert sampled_first.top == greedy_first.top
    chosen = {e.token_id: e.logprob for e in greedy_first.top}
    if sampled_first.token_id in chosen:
        assert sampled_first.logprob == chosen[sampled_first.token_id]


def test_records_read_the_logits_after_logit_bias(engine: Engine) -> None:
    prompt = chat(engine, FRANCE)
    plain = run_one(engine, prompt, greedy(max_tokens=1, top_logprobs=5)).records[0]
    runner_up = plain.top[1]
    biased = run_one(engine, prompt, greedy(max_tokens=1, top_logprobs=5, logit_bias={runner_up.token_id: 5.0}))
    record = biased.records[0]
    assert record.token_id == runner_up.token_id == record.top[0].token_id, "at temperature 0 the choice is top-1"
    expected = float(torch.tensor(runner_up.logit, dtype=torch.float32) + 5.0)
    assert record.top[0].logit == expected
    assert record.top2_margin == record.top[0].logit - record.top[1].logit


# --- the end of generation -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def france(engine: Engine) -> dict[str, Run]:
    prompt = chat(engine, FRANCE)
    return {
        "plain": run_one(engine, prompt, greedy(max_tokens=40, top_logprobs=5)),
        "ignore_eos": run_one(engine, prompt, greedy(max_tokens=10, top_logprobs=5, ignore_eos=True)),
        "min_tokens": run_one(engine, prompt, greedy(max_tokens=12, min_tokens=9, top_logprobs=5)),
    }


def test_eos_ends_the_turn_and_is_not_part_of_the_reply(engine: Engine, france: dict[str, Run]) -> None:
    plain = france["plain"]
    assert plain.last.finish_reason == "stop"
    n = len(plain.output_ids)
    assert 0 < n < 40 and plain.last.num_output_tokens == n
    assert [r.token_id for r in plain.records] == plain.output_ids
    assert not engine.end_ids & set(plain.output_ids)
    assert plain.text == engine.tokenizer.decode(plain.output_ids) == "The capital of France is Paris."
    assert "<|im_end|>" not in plain.text and plain.last.num_kept_tokens == n


def test_ignore_eos_bans_eos_but_its_logprob_stays_in_the_record(engine: Engine, france: dict[str, Run]) -> None:
    plain, ignored = france["plain"], france["ignore_eos"]
    n = len(plain.output_ids)
    assert ignored.last.finish_reason == "length" and ignored.last.num_output_tokens == 10
    assert ignored.output_ids[:n] == plain.output_ids and ignored.records[:n] == plain.records
    at_end = ignored.records[n]  # where the plain run chose EOS
    assert at_end.top[0].token_id in engine.end_ids, "EOS is still ranked first in the record"
    assert at_end.token_id == at_end.top[1].token_id and at_end.token_id not in engine.end_ids
    assert at_end.top[0].logprob > at_end.logprob
    assert not engine.end_ids & set(ignored.output_ids)
    assert ignored.text == engine.tokenizer.decode(ignored.output_ids)


def test_min_tokens_holds_eos_back_until_reached(engine: Engine, france: dict[str, Run]) -> None:
    plain, ignored, held = france["plain"], france["ignore_eos"], france["min_tokens"]
    assert len(held.output_ids) >= 9 > len(plain.output_ids)
    assert held.output_ids[:9] == ignored.output_ids[:9] and held.records[:9] == ignored.records[:9]
    assert not engine.end_ids & set(held.output_ids)
    if held.last.finish_reason == "stop":  # EOS allowed again from token 9: then it ended the turn
        assert len(held.output_ids) < 12
    else:
        assert held.last.finish_reason == "length" and len(held.output_ids) == 12


@pytest.mark.parametrize("max_tokens", [1, 3])
def test_max_tokens_finishes_with_length(engine: Engine, max_tokens: int) -> None:
    result = run_one(engine, chat(engine, "Write an essay on compilers."), greedy(max_tokens=max_tokens,
                                                                                   top_logprobs=2))
    assert result.last.finish_reason == "length"
    assert result.last.num_output_tokens == max_tokens == len(result.records) == len(result.output_ids)


@pytest.fixture(scope="module")
def essay(engine: Engine) -> tuple[list[int], Run]:
    prompt = chat(engine, "Write an essay on compilers.")
    return prompt, run_one(engine, prompt, greedy(max_tokens=24, top_logprobs=2, ignore_eos=True))


def token_starts(engine: Engine, ids: list[int]) -> list[int]:
    return [len(engine.tokenizer.decode(ids[:i])) for i in range(len(ids))]


@pytest.mark.parametrize("pick", ["mid-token", "spans-tokens", "whole-token", "twice", "earlier-listed-second"])
def test_stop_strings_cut_at_the_earliest_occurrence(engine: Engine, essay, pick: str) -> None:
    prompt, base = essay
    text, ids = base.text, base.output_ids
    starts = token_starts(engine, ids)
    assert text == engine.tokenizer.decode(ids) and text.isascii()
    k = 8  # a token well inside the reply
    piece = engine.tokenizer.decode([ids[k]])
    if pick == "mid-token":
        stop = (piece[1:-1] if len(piece) > 2 else piece,)
    elif pick == "spans-tokens":
        stop = (text[starts[k] + len(piece) - 2: starts[k] + len(piece) + 3],)
    elif pick == "whole-token":
        stop = (piece,)
    elif pick == "twice":
        stop = (next(w for w in (" the ", " a ", "s", "e") if text.count(w) >= 2),)
    else:
        stop = (text[starts[k + 4]:starts[k + 4] + 4], text[starts[k]:starts[k] + 4])
    cut = min(i for s in stop if (i := text.find(s)) >= 0)
    premise = {  # what each case is about
        "mid-token": lambda: starts[k] < cut < starts[k] + len(piece) - 1,
        "spans-tokens": lambda: cut < starts[k + 1] < cut + len(stop[0]),
        "whole-token": lambda: cut == starts[k],
        "twice": lambda: text.count(stop[0]) >= 2,
        "earlier-listed-second": lambda: -1 < text.find(stop[1]) < text.find(stop[0]),
    }
    assert premise[pick](), (pick, stop, text)
    kept = [i for i, start in enumerate(starts) if start < cut]
    result = run_one(engine, prompt, greedy(max_tokens=24, top_logprobs=2, ignore_eos=True, stop=stop))
    assert result.last.finish_reason == "stop"
    assert result.text == text[:cut]
    assert result.records == base.records[:len(kept)], "records of tokens wholly after the cut are dropped"
    assert result.last.num_kept_tokens == len(kept)
    # the request stopped at the token that completed the stop string
    done = next(n for n in range(1, len(ids) + 1) if any(s in engine.tokenizer.decode(ids[:n]) for s in stop))
    assert result.output_ids == ids[:done] and result.last.num_output_tokens == done


def test_streamed_deltas_equal_the_whole_reply(engine: Engine, essay) -> None:
    _, base = essay
    assert base.text == engine.tokenizer.decode(base.output_ids)
    assert [r.token_id for r in base.records] == base.output_ids
    assert [r.step for r in base.records] == list(range(len(base.output_ids)))
    assert all(d.finish_reason is None for d in base.deltas[:-1]) and base.last.finish_reason == "length"
    assert all(d.text or not d.records for d in base.deltas[:-1]), "records ride on chunks that carry text"


def test_an_emoji_reply_streams_whole_characters_with_their_records(engine: Engine) -> None:
    prompt = chat(engine, "Reply with three party emoji and nothing else: 🎉🎉🎉")
    result = run_one(engine, prompt, greedy(max_tokens=10, top_logprobs=1, ignore_eos=True))
    assert result.text == engine.tokenizer.decode(result.output_ids)
    assert [r.token_id for r in result.records] == result.output_ids
    assert "🎉" in result.text and any(len(d.records) == 3 for d in result.deltas), "3 byte tokens, one chunk"
    for d in result.deltas:
        assert "\ufffd" not in d.text or d is result.last, "no half characters mid-stream"
        assert d.text or not d.records or d is result.last


def test_prompt_scoring_agrees_with_the_generated_records(engine: Engine) -> None:
    """Route 1: records of a greedy reply (decode path). Route 2: the same tokens scored as a prompt."""
    prompt = chat(engine, FRANCE)
    generated = run_one(engine, prompt, greedy(max_tokens=5, top_logprobs=3, ignore_eos=True))
    scored = run_one(engine, prompt + generated.output_ids, SamplingParams(max_tokens=0, prompt_logprobs=3))
    prompt_records = scored.deltas[0].prompt_records
    assert scored.last.finish_reason == "length" and scored.last.num_output_tokens == 0
    assert len(prompt_records) == len(prompt) + 5 and prompt_records[0] is None
    for record, again in zip(generated.records, prompt_records[len(prompt):]):
        assert again.token_id == record.token_id
        assert abs(again.logprob - record.logprob) <= 1e-4
        assert [e.token_id for e in again.top] == [e.token_id for e in record.top]


# --- batch invariance (first version) -------------------------------------------------------------


def test_a_greedy_request_is_bitwise_the_same_alone_and_in_a_batch_of_four(engine: Engine) -> None:
    target = (chat(engine, "Explain how a hash map works, step by step."), greedy(max_tokens=10, top_logprobs=5))
    others = {
        "short": (chat(engine, "Hi"), greedy(max_tokens=3, top_logprobs=2)),
        "long": (chat(engine, "Describe the water cycle in detail, with evaporation, condensation, "
                              "precipitation and collection, and say why each matters for life on land."),
                 greedy(max_tokens=12)),
        "sampled": (chat(engine, "Tell me a short story."), SamplingParams(temperature=0.8, seed=11, max_tokens=8,
                                                                           top_logprobs=3)),
    }
    lengths = {len(p) for p, _ in [target, *others.values()]}
    assert len(lengths) == 4, "four different prompt lengths"
    alone = run_one(engine, *target)
    together = run(engine, {"target": target, **others})
    assert together["target"].output_ids == alone.output_ids
    assert together["target"].records == alone.records, "logprobs must be == , not allclose"
    # joining a batch that is already decoding changes nothing either
    joined = run(engine, others, join_later={"target": target}, join_after_steps=3)
    assert joined["target"].records == alone.records
    # and a seeded sampled request is the same whoever shares its batch
    sampled_alone = run_one(engine, *others["sampled"])
    assert together["sampled"].output_ids == joined["sampled"].output_ids == sampled_alone.output_ids
    assert together["sampled"].records == sampled_alone.records


def test_an_aborted_neighbour_leaves_the_others_unchanged(engine: Engine) -> None:
    target = (chat(engine, FRANCE), greedy(max_tokens=6, top_logprobs=3, ignore_eos=True))
    alone = run_one(engine, *target)
    engine.add_request("target", *target)
    engine.add_request("victim", chat(engine, "Write an essay on compilers."), greedy(max_tokens=20))
    outputs: dict[str, list[RequestOutput]] = {"target": [], "victim": []}
    steps = 0
    while engine.has_work():
        if steps == 3:
            engine.abort("victim")
        for out in engine.step():
            outputs[out.request_id].append(out)
        steps += 1
    engine.take_batch_summary()
    assert outputs["victim"][-1].finish_reason == "abort"
    assert sum(o.finish_reason is not None for o in outputs["victim"]) == 1
    assert [r for o in outputs["target"] for r in o.records] == alone.records


def test_a_failed_step_ends_each_of_its_requests_once_and_the_engine_forgets_them(engine: Engine,
                                                                                   monkeypatch) -> None:
    """One request finishes inside a step that then raises (its outputs lost), the other is
    mid-reply: fail_step gives each one final error, the engine forgets both (their ids are
    free again) and their slots come back at the next step."""
    prompt = chat(engine, FRANCE)
    engine.add_request("short", prompt, greedy(max_tokens=2, ignore_eos=True))
    engine.add_request("long", prompt, greedy(max_tokens=8, ignore_eos=True))
    engine.step()  # the prefill: both have their first token
    process = engine.outputs.process

    def process_then_raise(*args):
        process(*args)  # "short" finishes here
        raise RuntimeError("injected")

    monkeypatch.setattr(engine.outputs, "process", process_then_raise)
    with pytest.raises(RuntimeError, match="injected"):
        engine.step()
    monkeypatch.undo()
    failed = engine.fail_step("the step failed")
    assert sorted((o.request_id, o.finish_reason, o.error) for o in failed) == [
        ("long", "error", "the step failed"), ("short", "error", "the step failed")]
    assert engine.step() == [] and not engine.has_work()
    engine.take_batch_summary()
    assert engine.num_free_slots == engine.config.max_batch
    again = run(engine, {"short": (prompt, greedy(max_tokens=2, ignore_eos=True))})  # the id is free again
    assert len(again["short"].output_ids) == 2


# --- what the batch log's m counts ---------------------------------------------------------------


@pytest.mark.parametrize(("max_tokens", "m"), [(1, 0), (2, 4), (5, 4)])
def test_m_counts_sequences_decoded_together_not_prefilled(engine: Engine, max_tokens: int, m: int) -> None:
    """Four max_tokens 1 requests are prefilled together and finish there: nobody decoded,
    so m = 0 (the README's 'the most sequences decoded together'); with room to decode, 4."""
    prompt = chat(engine, FRANCE)
    for i in range(4):
        engine.add_request(f"m{i}", prompt, greedy(max_tokens=max_tokens, ignore_eos=True))
    while engine.has_work():
        engine.step()
    summary = engine.take_batch_summary()
    assert summary.max_batch_size == m
    assert summary.num_tokens == 4 * max_tokens
