"""Issue 59, item 6: the engine's share of the hand-made bugs an audit found the suite did not
catch. Each test names, under "catches:", the one-line change it was written against; each
holds a behaviour by a second route (plain decoding, a fresh engine on the new weights, the
portable twin), so it fails on that change and passes without it.

Speculation's tests do not leave drafting to this machine's step costs (whether a step keeps a
draft follows its measured timings): the drafts are either written by the test or kept every
step (a cost model in which a row is free)."""

import copy

import pytest
import torch

from batchproof.engine.cache.prefix_cache import Block, PrefixCache
from batchproof.engine.config import EngineConfig
from batchproof.engine.draft.drafter import Drafter
from batchproof.engine.engine import Engine
from batchproof.engine.model.ops import kernels
from batchproof.engine.model.weights import quant_weight
from batchproof.engine.outputs import VersionSpan
from batchproof.engine.sampling.params import SamplingParams
from batchproof.engine.sequence import Sequence, Status
from batchproof.engine.speculative.verify import verify
from batchproof.engine.text.text_stream import TextStream
from tests.engine.test_int8_numerics import cpu_has_vnni, odd_shape
from tests.engine.test_quant_register_path import REGISTER_TYPES, edge_blocks
from tests.engine.test_speculative import alone, chat, greedy, signature
from tests.engine.test_weight_swap import joined
from tests.helpers.quant_blocks import bits

# A short copying request (14 tokens of reply): drafts from its prompt are accepted in runs.
COPY = "Repeat exactly: Every night the keeper climbed the ninety steps and wound the clockwork."
STOP = "ninety"  # its 7th token

needs_kernels = pytest.mark.skipif(not kernels.available(), reason="the kernels are not built here")


@pytest.fixture(scope="module")
def plain():
    """The reference: no speculation, no prefix cache."""
    return Engine(EngineConfig(device="cpu", speculative=False, prefix_cache=False))


# --- 1, 2. speculative verify: what a step emits and what it counts as computed ---------------

def decoding(engine: Engine, params: SamplingParams) -> Sequence:
    """A running sequence that has chosen one token, its drafter attached (as the engine's are)."""
    prompt = chat(engine, "Name three animals.")
    seq = Sequence("v", prompt, params, TextStream(engine.tokenizer, params.stop), None)
    seq.status = Status.RUNNING
    seq.drafter = Drafter(prompt, 15)
    seq.append(engine.tokenizer.encode(" The", add_bos=False)[0])
    seq.num_computed = seq.num_tokens - 1  # as before a decode step: the last token not yet fed
    return seq


def own_outputs(engine: Engine):
    """The engine's output processor with counters of its own: the shared engine's batch
    summaries do not count these steps' tokens."""
    return copy.copy(engine.outputs)


def choosing(engine: Engine, *token_ids: int) -> torch.Tensor:
    """Logits [len(token_ids), V] whose row i has its greatest value at token_ids[i]."""
    logits = torch.zeros(len(token_ids), engine.model.lm_head.shape[0])
    for row, token_id in enumerate(token_ids):
        logits[row, token_id] = 10.0
    return logits


def words(engine: Engine, text: str) -> list[int]:
    ids = engine.tokenizer.encode(text, add_bos=False)
    assert engine.tokenizer.decode(ids) == text
    return ids


@needs_kernels
def test_verify_keeps_the_model_s_token_at_the_first_miss_and_counts_only_the_accepted_as_computed(engine):
    """Drafts [a, b, c]; the model chooses a, then x != b: the step emits [a, x] and stops
    reading rows; the slot holds valid keys for the last token and a only (b's row was
    written for a token the reply does not have), so the prefix cache may keep those two.

    catches: verify.py counting the first rejected draft's position as computed
    (`num_computed = last + 1 + num_accepted + (num_accepted < len(draft))`), which stores
    b's keys under x's position when the reply ends in that step."""
    a, b, c, x = words(engine, " cat dog cow fox")
    seq = decoding(engine, SamplingParams(temperature=0.0, max_tokens=16, top_logprobs=1))
    fed = seq.num_tokens  # positions once the last token is fed: 0..fed-1
    verified = verify(own_outputs(engine), [seq], [[a, b, c]], choosing(engine, a, x, c, a))
    (out,) = verified.outputs
    assert out.token_ids == [a, x] and seq.output_ids[-2:] == [a, x]
    assert verified.num_computed == [fed + 1]  # the last token's position and a's, not b's
    assert (out.num_draft_tokens, out.num_accepted_tokens) == (3, 1)


@needs_kernels
def test_verify_stops_at_a_stop_string_inside_an_accepted_run(engine):
    """Drafts [a, b, c]; the model chooses a, then b, which completes a stop string: the reply
    ends at b (it straddles the cut, so it is kept) and c's row is never read, though b matched
    its draft.

    catches: verify.py going on past a finished sequence (the `not seq.is_finished` test
    left out): it then reads c's row for a reply that has ended."""
    a, b, c = words(engine, " cat dog cow")
    seq = decoding(engine, SamplingParams(temperature=0.0, max_tokens=16, top_logprobs=1, stop=("dog",)))
    fed = seq.num_tokens
    verified = verify(own_outputs(engine), [seq], [[a, b, c]], choosing(engine, a, b, c, a))
    (out,) = verified.outputs
    assert out.finish_reason == "stop" and out.token_ids == [a, b] and seq.output_ids[-2:] == [a, b]
    assert out.text == " cat " and seq.is_finished
    assert verified.num_computed == [fed + 1]


@needs_kernels
def test_a_follow_up_to_a_reply_cut_by_a_stop_string_after_a_miss_is_bitwise_plain(engine, plain, monkeypatch):
    """A copying reply cut by a stop string, its drafts written here: every step drafts the
    plain reply's next tokens, except that the token that completes the stop string is drafted
    as another one, so the last step accepts a run and misses at its end, where the reply
    ends. The reply's own blocks and tail go to the cache; a follow-up holding the reply is
    served every position it computed, and gets the bits of an engine without a cache.

    catches: verify.py counting the rejected draft's position as computed: the cache then
    keeps the other token's keys under the last token's position (a follow-up's logprob
    -1.68702 where plain decoding gives -1.69607)."""
    ids = chat(engine, COPY)
    stop = greedy(64, stop=(STOP,), cache_namespace="audit-stop-after-a-miss")
    reply = [i for o in alone(plain, ids, stop) for i in o.token_ids]
    assert STOP in engine.tokenizer.decode(reply[-1:])  # the stop string's token is the reply's last
    unlikely = max(set(range(engine.tokenizer.vocab_size)) - set(reply) - set(ids) - engine.outputs.end_ids)
    script = reply[:-1] + [unlikely]  # what each output index is drafted as

    def scripted(seqs, max_model_len, cost):
        drafts = []
        for seq in seqs:
            n, room = len(seq.output_ids), seq.params.max_tokens - len(seq.output_ids) - 1
            drafts.append(script[n:n + min(7, room)] if seq.output_ids == reply[:n] else [])
        return drafts

    monkeypatch.setattr("batchproof.engine.engine.propose", scripted)
    first = alone(engine, ids, stop, "first")
    assert [i for o in first for i in o.token_ids] == reply and first[-1].finish_reason == "stop"
    assert 0 < first[-1].num_accepted_tokens < first[-1].num_draft_tokens
    monkeypatch.undo()
    follow_up = ids + reply + chat(engine, "Now say it again.")[1:]
    again = greedy(12, cache_namespace="audit-stop-after-a-miss")
    warm = alone(engine, follow_up, again, "warm")
    assert warm[-1].num_cached_tokens == len(ids) + len(reply) - 1  # all but the last token: never fed
    assert signature(warm) == signature(alone(plain, follow_up, greedy(12)))


class FreeRows:
    """A step-cost model in which a row costs nothing: every draft pays, so every step drafts
    as long as its drafter allows (timings are not kept)."""

    def __call__(self, rows: int) -> float:
        return 1.0

    def observe(self, rows: int, seconds: float) -> None:
        pass


@pytest.fixture
def drafting(engine, monkeypatch):
    """The session engine with every draft kept (sequences added from now on)."""
    monkeypatch.setattr(engine, "step_cost", FreeRows())
    return engine


@needs_kernels
@pytest.mark.parametrize("max_tokens", [5, 9, 12])
def test_max_tokens_inside_a_kept_run_ends_where_plain_decoding_does(drafting, plain, max_tokens):
    """catches: a verify that reads past max_tokens (drafts then always reach it here)."""
    ids = chat(drafting, COPY)
    params = greedy(max_tokens, ignore_eos=True, cache_namespace=None)
    spec = alone(drafting, ids, params)
    assert signature(spec) == signature(alone(plain, ids, params))
    assert spec[-1].num_output_tokens == max_tokens and spec[-1].num_draft_tokens > 0


@needs_kernels
def test_a_stop_string_inside_a_kept_run_ends_where_plain_decoding_does(drafting, plain):
    """catches: verify.py going on past a finished sequence (its `not seq.is_finished` test left
    out), which today only a step whose draft runs past the stop string shows."""
    ids = chat(drafting, COPY)
    params = greedy(64, stop=(STOP,), cache_namespace=None)
    spec = alone(drafting, ids, params)
    assert signature(spec) == signature(alone(plain, ids, params))
    assert spec[-1].finish_reason == "stop" and spec[-1].num_accepted_tokens > 0


@needs_kernels
def test_the_end_of_turn_inside_a_kept_run_ends_where_plain_decoding_does(drafting, plain):
    ids = chat(drafting, COPY)
    params = greedy(64, cache_namespace=None)
    spec = alone(drafting, ids, params)
    assert signature(spec) == signature(alone(plain, ids, params))
    assert spec[-1].finish_reason == "stop" and spec[-1].end_token_id is not None
    assert spec[-1].num_accepted_tokens > 0


# --- 3. the int8 VNNI twin with a residual ---------------------------------------------------

def vnni_here() -> bool:
    return kernels.available() and kernels.isa_level() >= 2 and cpu_has_vnni()


@pytest.mark.parametrize("level", [
    pytest.param(2, marks=pytest.mark.skipif(not vnni_here(), reason="no AVX-512 VNNI here")),
    pytest.param(1, marks=pytest.mark.skipif(not (kernels.available() and kernels.isa_level() >= 1),
                                             reason="no AVX2 here")),
], ids=["vnni", "avx2"])
@pytest.mark.parametrize("qtype", REGISTER_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("outputs", [101, 8], ids=lambda n: f"{n}-outputs")
def test_an_int8_twin_adds_the_product_to_a_residual_once(level, qtype, outputs):
    """y = residual + x @ w^T (the fused residual of the projections), bit for bit the portable
    twin's, at 101 outputs (an odd 13th tile, ragged) and 8 (one tile): the VNNI twin runs an
    odd last tile as a pair with itself and must store it once.

    catches: quant_int8_linear.c storing the paired copy of an odd last tile too (the
    `second != t` test left out): without a residual the second store writes the same values,
    with one the product is added twice. Only a CPU with AVX-512 VNNI runs that path."""
    try:
        raw = edge_blocks(qtype, outputs, odd_shape(qtype)[1], seed=int(qtype) + 29)
        w = kernels.int8_layout(quant_weight(raw))
        g = torch.Generator().manual_seed(outputs)
        x = torch.randn(20, raw.shape[1], generator=g)
        residual = torch.randn(20, outputs, generator=g)
        for m in (1, 2, 5, 16, 17, 20):
            got = []
            for run_level in (level, 0):
                kernels.cap_isa_level(run_level)
                got.append(kernels.linear_q_int8(x[:m], w, None, 1, residual=residual[:m].clone()))
            assert torch.equal(bits(got[0]), bits(got[1])), f"{m} rows: level {level} differs from the portable twin"
            kernels.cap_isa_level(0)
            alone_product = kernels.linear_q_int8(x[:m], w, None, 1)
            finite = torch.isfinite(alone_product)
            assert not torch.equal(bits(got[1])[finite], bits(alone_product)[finite])  # the residual was added
    finally:
        kernels.cap_isa_level(2)


# --- 4. weight versions: the end-of-turn token is in the spans -------------------------------

def test_the_end_of_turn_token_is_covered_by_the_version_spans(engine):
    """A reply ended by its end-of-turn token: that token was chosen by the weights like any
    other, so the spans cover the reply's ids and it (24 ids: 0..24, not 0..23).

    catches: weight_versions.label not counting the end token
    (`+ (out.end_token_id is not None)` left out)."""
    ids = chat(engine, "Hi")
    outs = alone(engine, ids, SamplingParams(temperature=0.0, max_tokens=64, cache_namespace=None))
    assert outs[-1].finish_reason == "stop" and outs[-1].end_token_id is not None
    reply = [i for o in outs for i in o.token_ids]
    spans = joined([s for o in outs for s in o.weight_version_spans])
    assert spans == [VersionSpan(0, len(reply) + 1, engine.weight_version)]


# --- 5, 6. a keep swap: no old key in the new prefix cache -----------------------------------

def tiny(path, **extra) -> Engine:
    config = {"device": "cpu", "max_batch": 4, "num_threads": 1, "max_prefill_tokens": 8, **extra}
    return Engine(EngineConfig(model_path=path, **config))


def reply_records(outs) -> list:
    return [(r.token_id, r.logprob, tuple((t.token_id, t.logprob) for t in r.top)) for o in outs for r in o.records]


TINY_PROMPT = "hello the world and then the world hello " * 3
TINY_PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, top_logprobs=2)


@needs_kernels
def test_a_finished_sequence_awaiting_retirement_leaves_no_old_key_across_a_keep_swap(tiny_pair):
    """A request finishes; before the next step retires it (its slot still holds the old
    weights' keys), the weights are swapped in keep mode. The same prompt then finds nothing
    cached and gets the bits of a fresh engine on the new weights.

    catches: Engine._refeed returning for a finished sequence before it zeroes
    `num_computed`: its retirement then stores the old keys in the new weights' cache."""
    old_path, new_path = tiny_pair
    swapped, fresh = tiny(old_path), tiny(new_path)
    assert swapped.prefix_cache is not None
    prompt = swapped.tokenizer.encode(TINY_PROMPT, add_bos=False)
    swapped.add_request("a", prompt, TINY_PARAMS)
    while not any(out.finish_reason for out in swapped.step()):
        pass
    assert [s.request_id for s in swapped.scheduler.running] == ["a"]  # finished, not yet retired
    swapped.install_weights(swapped.prepare_weights(new_path), keep=True)
    after = swapped.generate({"b": (prompt, TINY_PARAMS)})["b"]
    expected = fresh.generate({"b": (prompt, TINY_PARAMS)})["b"]
    assert after[-1].num_cached_tokens == 0
    assert reply_records(after) == reply_records(expected)


@needs_kernels
def test_a_keep_swap_after_the_prompt_is_stored_starts_an_empty_cache(tiny_pair):
    """The prompt's blocks are in the cache (its prefill has ended) when the weights are swapped
    in keep mode: the cache the new weights get holds nothing, and once the refilled sequence
    has left its blocks there, the same prompt gets a fresh engine's bits on the new weights.

    catches: a keep swap keeping the old prefix cache (engine.install_weights replacing it only
    in drain mode). The older test swaps while the prompt is still being fed, when the old
    cache is empty anyway."""
    old_path, new_path = tiny_pair
    swapped, fresh = tiny(old_path), tiny(new_path)
    prompt = swapped.tokenizer.encode(TINY_PROMPT, add_bos=False)
    swapped.add_request("a", prompt, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    while not len(swapped.prefix_cache):
        swapped.step()
    assert swapped.has_work()  # mid-generation
    swapped.install_weights(swapped.prepare_weights(new_path), keep=True)
    assert len(swapped.prefix_cache) == 0
    while swapped.has_work():
        swapped.step()
    after = swapped.generate({"b": (prompt, TINY_PARAMS)})["b"]
    expected = fresh.generate({"b": (prompt, TINY_PARAMS)})["b"]
    assert after[-1].num_cached_tokens > 0  # what the refilled sequence left, under the new weights
    assert reply_records(after) == reply_records(expected)


# --- 8. the prefix cache: a tail is chained to the last whole block --------------------------

def block(num_tokens: int) -> Block:
    return Block(torch.zeros(1, 1, num_tokens, 2), torch.zeros(1, 1, num_tokens, 2), None)


def test_a_tail_is_served_only_after_the_whole_blocks_it_followed():
    """A sequence leaves two whole blocks and a tail of 5 (as a retirement stores them). A
    prompt of the first block followed by the tail's tokens shares only that first block:
    the tail's keys were computed after the second block, at other positions.

    catches: prefix_cache.tail_key chaining a tail to the first whole block (`keys[0]`)
    instead of the last: that prompt is then served the other prompt's tail."""
    cache = PrefixCache(16, 2**20, "model")
    stored = list(range(100, 137))  # 2 whole blocks + 5
    keys = cache.keys(stored, 2)
    keys.append(cache.tail_key(stored, 2, 5, "", keys))
    cache.insert(keys, {0: block(16), 1: block(16), 2: block(5)})
    assert [b.num_tokens for b in cache.match(stored + [7], len(stored), need_hidden=False)] == [16, 16, 5]
    other = stored[:16] + stored[32:] + [7]  # the first block, then the tail's tokens
    assert [b.num_tokens for b in cache.match(other, len(other) - 1, need_hidden=False)] == [16]
    shifted = stored[:16] + [1] * 16 + stored[32:] + [7]  # the tail's tokens after another second block
    assert [b.num_tokens for b in cache.match(shifted, len(shifted) - 1, need_hidden=False)] == [16]


# --- 9. the scheduler: a deferred newcomer keeps its place -----------------------------------

@needs_kernels
def test_a_newcomer_waiting_for_a_shared_prefill_keeps_its_place_at_the_head(tiny_pair, monkeypatch):
    """Two slots. P (64 tokens) is being fed; then N (sharing P's first 48), Q1 and Q2 arrive.
    N waits for P's prefill rather than compute the shared 48 beside it, and Q1 takes the free
    slot; the next slot to free is N's, not Q2's, which arrived after it.

    catches: scheduler._admit putting the deferred newcomers at the tail of the queue
    (`waiting.extend(deferred)`) instead of back at its head."""
    eng = tiny(tiny_pair[0], max_batch=2)
    admitted: list[str] = []
    admit = eng.caches.admit

    def noting(seq):
        admitted.append(seq.request_id)
        return admit(seq)

    monkeypatch.setattr(eng.caches, "admit", noting)
    p = list(range(10, 74))
    prompts = {"P": p, "N": p[:48] + list(range(200, 208)), "Q1": [100, 101, 102, 103], "Q2": [110, 111, 112, 113]}
    # P ends soon after its prefill; Q1 outlasts it (a prefill step beside decoding feeds as
    # little as one token, so P's prefill may take ~56 of Q1's tokens).
    lengths = {"P": 4, "N": 2, "Q1": 100, "Q2": 2}
    eng.add_request("P", prompts["P"], SamplingParams(temperature=0.0, max_tokens=lengths["P"], ignore_eos=True))
    eng.step()  # P admitted, its first 8 tokens fed
    for rid in ("N", "Q1", "Q2"):
        eng.add_request(rid, prompts[rid], SamplingParams(temperature=0.0, max_tokens=lengths[rid], ignore_eos=True))
    eng.step()
    assert admitted == ["P", "Q1"]  # N waits for P's prefill
    while eng.has_work():
        eng.step()
    assert admitted == ["P", "Q1", "N", "Q2"]
