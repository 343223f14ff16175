"""The prefix cache changes no bit: a request whose prefix came from the cache gets the
same tokens, logprobs, top alternatives and prompt logprobs (`==` on every float) as on
an engine without a cache, alone or joining a running batch; and the cache keeps to its
budget.

Two engines on the real default model: `warm` keeps a cache across the module's tests
(so earlier tests feed later ones, as on a long-running server), `cold` has none.
"""

import dataclasses

import pytest
import torch

from batchproof.engine.cache.prefix_cache import Block, PrefixCache
from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.ops import kernels
from batchproof.engine.sampling.params import SamplingParams

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the cache needs our kernels")

SYSTEM = ("You are a meticulous assistant for a public library. You answer questions about opening hours, "
          "memberships, inter-library loans and the reading room, briefly and politely. ") * 3
QUESTIONS = ["When does the reading room open?", "How do I renew a loan?", "Can I bring my dog?"]
TOP = 3


@pytest.fixture(scope="module")
def warm(engine):
    return engine  # the session's engine: the cache is on by default


@pytest.fixture(scope="module")
def cold():
    return Engine(EngineConfig(device="cpu", prefix_cache=False))


def params(max_tokens: int = 8, **extra) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, top_logprobs=TOP, **extra)


def signature(outputs) -> tuple:
    """Every float a reply carries, exactly."""
    records = [(r.token_id, r.logprob, tuple((t.token_id, t.logit, t.logprob) for t in r.top))
               for out in outputs for r in out.records]
    prompt = outputs[0].prompt_records
    scored = None if prompt is None else [
        None if r is None else (r.token_id, r.logprob, tuple((t.token_id, t.logit, t.logprob) for t in r.top))
        for r in prompt]
    return records, scored, "".join(out.text for out in outputs)


def run(engine, requests: dict) -> dict:
    return {rid: out for rid, out in engine.generate(requests).items()}


def chat(engine, *turns: tuple[str, str]) -> list[int]:
    return engine.chat_prompt_ids([{"role": role, "content": text} for role, text in turns])


def test_a_shared_system_prompt_is_served_from_the_cache_with_the_same_bits(warm, cold):
    prompts = [chat(warm, ("system", SYSTEM), ("user", q)) for q in QUESTIONS]
    first = run(warm, {"q0": (prompts[0], params())})["q0"]
    assert first[-1].num_cached_tokens == 0 or first[-1].num_cached_tokens < len(prompts[0])
    for i, ids in enumerate(prompts):
        hot = run(warm, {f"h{i}": (ids, params())})[f"h{i}"]
        fresh = run(cold, {f"c{i}": (ids, params())})[f"c{i}"]
        assert hot[-1].num_cached_tokens >= 16 * ((len(chat(warm, ("system", SYSTEM))) - 16) // 16)
        assert fresh[-1].num_cached_tokens == 0
        assert signature(hot) == signature(fresh)


def test_prompt_logprobs_of_a_cached_prefix_are_the_same_bits(warm, cold):
    """Scored once at top 2, the prefix's blocks keep their records: a request at top 2 or
    less reads them (top 1 is the first entry of top 2), one at top 5 scores the hidden
    states through the LM head again; every float equals a fresh engine's."""
    ids = chat(warm, ("system", SYSTEM), ("user", "Where is the reading room?"))
    run(warm, {"seed": (ids, params(max_tokens=2, prompt_logprobs=2))})
    blocks = warm.prefix_cache.match(ids, len(ids) - 1, need_hidden=True)
    assert blocks and all(b.records is not None and b.records_top >= 2 for b in blocks)
    for top in (2, 1, 5, 0):
        scoring = params(max_tokens=2, prompt_logprobs=top)
        hot = run(warm, {f"again{top}": (ids, scoring)})[f"again{top}"]
        fresh = run(cold, {f"fresh{top}": (ids, scoring)})[f"fresh{top}"]
        assert hot[-1].num_cached_tokens >= len(ids) - 16
        assert signature(hot) == signature(fresh)
        assert len(hot[0].prompt_records) == len(ids)
        assert all(len(r.top) <= top for r in hot[0].prompt_records[1:])


def test_a_multi_turn_continuation_reuses_the_reply_it_follows(warm, cold):
    """Turn two's prompt holds turn one's reply: blocks computed by decode steps serve it."""
    turn_one = chat(warm, ("user", "Describe a lighthouse at night in three sentences."))
    reply = run(warm, {"t1": (turn_one, params(max_tokens=40))})["t1"]
    text = "".join(out.text for out in reply)
    turn_two = chat(warm, ("user", "Describe a lighthouse at night in three sentences."), ("assistant", text),
                    ("user", "Now make it shorter."))
    hot = run(warm, {"t2": (turn_two, params())})["t2"]
    fresh = run(cold, {"t2c": (turn_two, params())})["t2c"]
    assert hot[-1].num_cached_tokens > len(turn_one)  # past the first prompt: into the reply
    assert signature(hot) == signature(fresh)
    # Scoring that prompt needs hidden states that decode steps did not keep: the cache
    # serves only the blocks that have them, and the bits stay the same.
    scoring = params(max_tokens=1, prompt_logprobs=1)
    assert signature(run(warm, {"s": (turn_two, scoring)})["s"]) == signature(run(cold, {"sc": (turn_two,
                                                                                                scoring)})["sc"])


def test_prompts_that_diverge_mid_block_share_only_the_whole_blocks(warm, cold):
    base = warm.tokenizer.encode("The history of the printing press begins in the fifteenth century, when " * 4)
    a, b = base[:40] + base[50:70], base[:40] + base[60:80]  # the same 40 tokens, then not
    run(warm, {"a": (a, params())})
    hot = run(warm, {"b": (b, params())})["b"]
    assert hot[-1].num_cached_tokens == 32  # blocks 0 and 1; block 2 (32..47) differs at 40
    assert signature(hot) == signature(run(cold, {"bc": (b, params())})["bc"])


def test_requests_racing_for_the_same_blocks_and_a_cached_prefix_joining_a_batch(warm, cold):
    ids = chat(warm, ("system", SYSTEM), ("user", "List three services of a library, " * 3))
    expected = signature(run(cold, {"alone": (ids, params())})["alone"])
    racing = run(warm, {f"r{i}": (ids, params()) for i in range(4)})  # admitted together: none cached yet
    assert all(signature(out) == expected for out in racing.values())
    # A long request is decoding; the same prompt arrives mid-way and joins the batch cached.
    warm.add_request("long", chat(warm, ("user", "Count slowly.")), params(max_tokens=24))
    outputs: dict[str, list] = {"long": [], "late": []}
    for step in range(40):
        if step == 5:
            warm.add_request("late", ids, params())
        for out in warm.step():
            outputs[out.request_id].append(out)
        if not warm.has_work():
            break
    assert outputs["late"][-1].num_cached_tokens > 0
    assert signature(outputs["late"]) == expected


def test_chunked_prefill_gives_the_same_prefix_in_any_chunk_layout():
    """A prefix computed in chunks of 7 serves a prompt prefilled in chunks of 2048, and back."""
    small = Engine(EngineConfig(device="cpu", max_prefill_tokens=7, max_batch=2, prefix_cache_mb=64))
    plain = Engine(EngineConfig(device="cpu", max_batch=2, prefix_cache=False))
    ids = small.tokenizer.encode("A prefix long enough to span several chunks and blocks of the cache. " * 3)
    small_first = run(small, {"one": (ids, params(prompt_logprobs=2))})["one"]
    small_cached = run(small, {"two": (ids, params(prompt_logprobs=2))})["two"]
    whole = run(plain, {"three": (ids, params(prompt_logprobs=2))})["three"]
    assert small_cached[-1].num_cached_tokens > 0
    assert signature(small_first) == signature(small_cached) == signature(whole)


def test_eviction_keeps_the_cache_within_a_tiny_budget(cold):
    tiny = Engine(EngineConfig(device="cpu", max_batch=2, prefix_cache_mb=2))  # two or three blocks
    cache = tiny.prefix_cache
    prompts = [tiny.tokenizer.encode(f"Story number {i}: once upon a time, in a valley of {i} rivers, " * 3)
               for i in range(4)]
    for i, ids in enumerate(prompts + prompts[:1]):
        hot = run(tiny, {f"e{i}": (ids, params(max_tokens=4))})[f"e{i}"]
        assert cache.nbytes <= cache.budget_bytes
        assert signature(hot) == signature(run(cold, {f"ec{i}": (ids, params(max_tokens=4))})[f"ec{i}"])
    assert cache.stats.evicted_blocks > 0


def test_the_cache_counts_what_its_requests_were_served(warm):
    """One owner of the counters: the cache's lookups and hits are exactly the prompt tokens
    its requests brought and the cached tokens their replies report."""
    before = dataclasses.replace(warm.prefix_cache.stats)
    prompts = [chat(warm, ("system", SYSTEM), ("user", q)) for q in QUESTIONS]
    replies = run(warm, {f"n{i}": (ids, params(max_tokens=2)) for i, ids in enumerate(prompts)})
    stats = warm.prefix_cache.stats
    assert stats.queried_tokens - before.queried_tokens == sum(len(ids) for ids in prompts)
    served = sum(reply[-1].num_cached_tokens for reply in replies.values())
    assert served > 0 and stats.hit_tokens - before.hit_tokens == served


def test_no_prefix_cache_and_the_torch_path_have_none(cold):
    assert cold.prefix_cache is None and cold.info()["prefix_cache"]["enabled"] is False
    torch_engine = Engine(EngineConfig(device="cpu", is_batch_invariant=False, max_batch=1))
    assert torch_engine.prefix_cache is None
    assert "cannot promise" in torch_engine.info()["prefix_cache"]["reason"]


# --- the cache as a unit ---------------------------------------------------------------


def block(value: float, hidden: bool = True) -> Block:
    value = float(value)
    return Block(torch.full((2, 1, 4, 3), value), torch.full((2, 1, 4, 3), -value),
                 torch.full((4, 5), value) if hidden else None)


def test_keys_name_the_whole_prefix_and_the_model():
    cache = PrefixCache(4, 10**6, "model-a")
    a = cache.keys([1, 2, 3, 4, 5, 6, 7, 8], 2)
    assert cache.keys([1, 2, 3, 4, 5, 6, 7, 8, 9], 2) == a
    assert cache.keys([0, 2, 3, 4, 5, 6, 7, 8], 2)[1] != a[1]  # a different first block changes every later key
    assert PrefixCache(4, 10**6, "model-b").keys([1, 2, 3, 4], 1)[0] != a[0]


def test_lru_eviction_takes_the_deepest_blocks_of_the_oldest_prefix_first():
    one = block(1.0).nbytes
    cache = PrefixCache(4, 3 * one, "m")
    old = cache.keys(list(range(12)), 3)
    cache.insert(old, {0: block(1), 1: block(2), 2: block(3)})
    assert len(cache) == 3 and cache.nbytes == 3 * one
    new = cache.keys(list(range(100, 104)), 1)
    cache.insert(new, {0: block(4)})
    assert cache.nbytes <= cache.budget_bytes and cache.stats.evicted_blocks == 1
    assert [b.k[0, 0, 0, 0].item() for b in cache.match(list(range(12)), 12, need_hidden=False)] == [1, 2]
    assert cache.match(list(range(100, 104)), 4, need_hidden=False)[0].k[0, 0, 0, 0].item() == 4


def test_a_match_stops_at_blocks_without_hidden_states_when_they_are_needed():
    cache = PrefixCache(4, 10**6, "m")
    keys = cache.keys(list(range(8)), 2)
    cache.insert(keys, {0: block(1), 1: block(2, hidden=False)})
    assert len(cache.match(list(range(8)), 8, need_hidden=False)) == 2
    assert len(cache.match(list(range(8)), 8, need_hidden=True)) == 1
    assert len(cache.match(list(range(8)), 7, need_hidden=False)) == 1  # the limit counts whole blocks
    cache.insert(keys, {1: block(2)})  # hidden states arrive later: the block is upgraded in place
    assert len(cache.match(list(range(8)), 8, need_hidden=True)) == 2 and len(cache) == 2


def test_cached_blocks_make_way_for_running_sequences():
    """One budget for both: as the running sequences' keys and values grow, the least
    recently used blocks go; as a sequence leaves, its room returns."""
    one = block(1.0).nbytes
    cache = PrefixCache(4, 4 * one, "m")
    old, new = cache.keys(list(range(8)), 2), cache.keys(list(range(100, 108)), 2)
    cache.insert(old, {0: block(1), 1: block(2)})
    cache.insert(new, {0: block(3), 1: block(4)})
    cache.make_room(2 * one)  # running sequences now hold two blocks' worth
    assert cache.nbytes <= 2 * one and cache.stats.evicted_blocks == 2
    assert cache.match(list(range(8)), 8, need_hidden=False) == []  # the older prefix went
    assert len(cache.match(list(range(100, 108)), 8, need_hidden=False)) == 2
    cache.insert(cache.keys(list(range(200, 204)), 1), {0: block(5)})  # the newest stays, an older one goes
    assert len(cache) == 2 and cache.nbytes <= 2 * one
    assert len(cache.match(list(range(200, 204)), 4, need_hidden=False)) == 1
    cache.leaving(2 * one)  # they finished
    cache.insert(cache.keys(list(range(300, 308)), 2), {0: block(6), 1: block(7)})
    assert len(cache) == 4 and cache.nbytes <= cache.budget_bytes


def test_a_tail_follows_the_whole_blocks_and_is_never_a_whole_block():
    cache = PrefixCache(4, 10**6, "m")
    tokens = list(range(7))  # one whole block and a tail of three
    keys = cache.keys(tokens, 1)
    tail = cache.tail_key(tokens, 1, 3)
    cache.insert([*keys, tail], {0: block(1), 1: Block(torch.full((2, 1, 3, 3), 2.0), torch.zeros(2, 1, 3, 3), None)})
    found = cache.match(list(range(10)), 9, need_hidden=False)
    assert [b.num_tokens for b in found] == [4, 3] and cache.stats.hit_tokens == 7
    assert [b.num_tokens for b in cache.match(list(range(6)) + [99], 6, need_hidden=False)] == [4]  # tail differs
    assert [b.num_tokens for b in cache.match(list(range(10)), 6, need_hidden=False)] == [4]  # past the limit
    assert [b.num_tokens for b in cache.match(list(range(10)), 9, need_hidden=True)] == [4]  # tails keep no hidden
    assert tail not in cache.keys(list(range(8)), 2) and cache.tail_key(tokens, 1, 3, namespace="x") != tail
    short = cache.tail_key([5, 6], 0, 2)  # a tail with no whole block before it is never served
    cache.insert([short], {0: Block(torch.zeros(2, 1, 2, 3), torch.zeros(2, 1, 2, 3), None)})
    assert cache.match([5, 6, 7], 2, need_hidden=False) == []


def test_the_next_turn_finds_every_position_the_last_one_computed(warm, cold):
    """A reply ending mid-block: the next prompt gets its whole blocks and its tail from the
    cache (all but the last token chosen, never fed back), with the bits of computing afresh."""
    turn_one = chat(warm, ("user", "Name a river and say one thing about it."))
    reply = run(warm, {"tail1": (turn_one, params(max_tokens=21))})["tail1"]
    output_ids = [t for out in reply for t in out.token_ids]
    computed = len(turn_one) + len(output_ids) - 1
    assert computed % 16 != 0
    turn_two = turn_one + output_ids + warm.tokenizer.encode(" And another one?", add_bos=False)
    hot = run(warm, {"tail2": (turn_two, params())})["tail2"]
    assert hot[-1].num_cached_tokens == computed
    assert signature(hot) == signature(run(cold, {"tail2c": (turn_two, params())})["tail2c"])


def test_a_shared_prefix_serves_a_batch_whose_own_keys_outgrow_the_budget(cold):
    """32 requests sharing a cached system prompt on 16 slots, their replies of different lengths:
    the first 16, admitted together, hold more keys and values than the whole budget, yet each
    copies the prefix at admission (before the step makes room for them); the other 16 are
    admitted one by one as slots free, while the rest still outgrow the budget, and find it
    because the cache keeps its most recent quarter. Every reply the bits of an engine without
    a cache."""
    small = Engine(EngineConfig(device="cpu", max_batch=16, prefix_cache_mb=64))
    cache = small.prefix_cache
    system = chat(small, ("system", SYSTEM))
    run(small, {"warm": (chat(small, ("system", SYSTEM), ("user", "Hello.")), params(max_tokens=2))})
    prompts = {f"q{i}": chat(small, ("system", SYSTEM), ("user", f"Question {i}: what are your hours? " * 4))
               for i in range(32)}
    assert sum(len(prompts[f"q{i}"]) for i in range(16)) * small.caches.kv.bytes_per_token > cache.budget_bytes
    requests = {rid: (ids, params(max_tokens=2 + i % 16)) for i, (rid, ids) in enumerate(prompts.items())}
    hot, fresh = run(small, requests), run(cold, requests)
    for rid in prompts:
        assert hot[rid][-1].num_cached_tokens >= 16 * (len(system) // 16 - 1), rid
        assert signature(hot[rid]) == signature(fresh[rid])
    assert cache.nbytes <= cache.budget_bytes


def test_sixteen_at_once_with_a_new_shared_prompt_compute_it_once(cold):
    """16 requests arriving together whose (uncached) system prompt is most of their prompts: the
    first is fed, the others wait for its prefill and copy the prefix it stored, so 15 of them
    report it cached; every reply the bits of an engine without a cache."""
    system = "You are the archivist of a lighthouse museum; answer from the logbooks, briefly. " * 6
    prompts = {f"s{i}": chat(cold, ("system", system), ("user", f"Entry {i}?")) for i in range(16)}
    shared = len(chat(cold, ("system", system))) // 16 * 16
    eng = Engine(EngineConfig(device="cpu", max_batch=16))
    hot = run(eng, {rid: (ids, params(max_tokens=3)) for rid, ids in prompts.items()})
    fresh = run(cold, {rid: (ids, params(max_tokens=3)) for rid, ids in prompts.items()})
    cached = sorted(hot[rid][-1].num_cached_tokens for rid in prompts)
    assert cached[0] == 0 and cached[1] >= shared - 16, cached
    assert all(signature(hot[rid]) == signature(fresh[rid]) for rid in prompts)


def test_a_short_prompt_does_not_wait_for_a_long_one_it_shares_little_with(warm):
    """A newcomer sharing a short opening with a long prompt still being fed is fed beside it:
    waiting would cost it the long prompt's whole prefill to save a few blocks."""
    opening = "Notes of the harbour office, read aloud to new staff on their first morning. " * 2
    long_ids = chat(warm, ("user", opening + "The tide tables, the mooring fees and the rules. " * 60))
    short_ids = chat(warm, ("user", opening + "Where is the kettle?"))
    warm.add_request("long", long_ids, params(max_tokens=2))
    warm.add_request("short", short_ids, params(max_tokens=2))
    firsts: dict[str, int] = {}
    for step in range(200):
        for out in warm.step():
            firsts.setdefault(out.request_id, step)
        if not warm.has_work():
            break
    assert firsts["short"] <= firsts["long"]  # not after it (deferred, it would start a step later)
