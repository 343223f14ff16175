"""Speculative decoding changes no bit: every request gets the same tokens, logprobs and top-20
alternatives (`==` on every float), the same text and the same ending with speculation as
without, alone and in a batch of 16 mixed requests, greedy and seeded, under a JSON schema,
with the prefix cache warm and cold; and prompts that repeat text do get drafts accepted, so
the verifying path is the one these tests run.

The session's `engine` speculates (the default); `plain` is an engine without speculation
or prefix cache: the reference."""

import json

import pytest

from batchproof.engine.config import EngineConfig
from batchproof.engine.draft.cost import StepCost
from batchproof.engine.draft.drafter import Drafter
from batchproof.engine.draft.lookup import NgramIndex
from batchproof.engine.engine import Engine
from batchproof.engine.grammar import compile as grammars
from batchproof.engine.model.ops import kernels
from batchproof.engine.sampling.params import SamplingParams
from tests.helpers.second_model import gemma_package  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(not kernels.available(), reason="speculation needs our kernels")

PASSAGE = ("The lighthouse stood on a rock at the mouth of the bay. Every night the keeper climbed the "
           "ninety steps, trimmed the wick and wound the clockwork that turned the lens. Ships passing in "
           "the dark saw the beam sweep the water every twelve seconds, and knew where the reef lay.")
EDIT = f"Copy this text exactly, changing 'ninety' to 'eighty':\n\n{PASSAGE}"
EXTRACT = f"From this passage, give the number of steps and the beam's period as JSON.\n\n{PASSAGE}"
FREE = "Write a short poem about autumn leaves."
SCHEMA = {"type": "object", "properties": {"steps": {"type": "integer"}, "period_s": {"type": "integer"},
                                           "place": {"type": "string"}},
          "required": ["steps", "period_s", "place"], "additionalProperties": False}
TOP = 20


@pytest.fixture(scope="module")
def plain():
    return Engine(EngineConfig(device="cpu", speculative=False, prefix_cache=False))


def signature(outputs) -> tuple:
    """Every float a reply carries, exactly, with its text and ending."""
    records = [(r.step, r.token_id, r.logprob, tuple((t.token_id, t.logit, t.logprob) for t in r.top))
               for out in outputs for r in out.records]
    return records, "".join(out.text for out in outputs), [i for o in outputs for i in o.token_ids], \
        outputs[-1].finish_reason, outputs[-1].num_output_tokens


def chat(engine, text: str) -> list[int]:
    return engine.chat_prompt_ids([{"role": "user", "content": text}])


def greedy(max_tokens: int = 64, **extra) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, top_logprobs=TOP, **extra)


def seeded(seed: int, max_tokens: int = 64, **extra) -> SamplingParams:
    return SamplingParams(temperature=0.7, seed=seed, max_tokens=max_tokens, top_logprobs=TOP, **extra)


def alone(engine, prompt_ids: list[int], params: SamplingParams, request_id: str = "r"):
    return engine.generate({request_id: (prompt_ids, params)})[request_id]


# --- the drafts -----------------------------------------------------------------------------

def test_lookup_drafts_what_followed_the_latest_longest_match_of_the_tail():
    index = NgramIndex([1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 6, 2, 3])
    assert index.draft(3) == [7, 8, 6]  # no earlier [6, 2, 3]; [2, 3] last before 7 (the tail has no follower)
    index.extend([7])
    assert index.draft(5) == [8, 6, 2, 3, 7]  # [2, 3, 7], copied through to the end
    assert index.draft(7) == [8, 6, 2, 3, 7, 8, 6]  # then on, with the match's period
    assert index.draft(1) == [8]
    assert NgramIndex([5, 6, 7]).draft(4) == []


def accept(drafter: Drafter, times: int, num_proposed: int, num_accepted: int) -> None:
    for _ in range(times):
        drafter.observe(num_proposed, num_accepted)


def test_draft_length_follows_acceptance_and_backs_off_on_misses():
    drafter = Drafter([1, 2, 3, 1, 2, 3, 1, 2], max_len=15)  # periodic: [3, 1, 2] repeats
    assert drafter.propose([], room=15) == [3]  # unmeasured: one token (one cheap row)
    accept(drafter, 3, 1, 1)
    assert drafter.propose([], room=15) == [3, 1, 2]  # taken: three (the 4-row tile)
    accept(drafter, 6, 3, 3)
    assert drafter.propose([], room=15) == [3, 1, 2] * 5  # all taken, always: the longest
    assert drafter.propose([], room=2) == [3, 1]  # never past the room it is given
    drafter.observe(15, 0)  # a miss: shorter, and a step without drafts
    assert drafter.propose([], room=15) == []
    assert 0 < len(drafter.propose([], room=15)) < 15
    misses = 0
    while not drafter.is_probing and misses < 10:  # misses in a row: the estimate falls to nothing pays
        drafter.observe(1, 0)
        misses += 1
    assert drafter.is_probing and misses > 2
    assert [drafter.propose([], room=15) for _ in range(31)] == [[]] * 31  # the longest wait
    assert drafter.propose([], room=15) == [3]  # then a probe
    assert (drafter.num_proposed, drafter.num_accepted) == (3 + 18 + 15 + misses, 3 + 18)


def test_a_step_keeps_only_the_drafts_that_pay_for_their_rows():
    from types import SimpleNamespace

    from batchproof.engine.speculative.propose import _worth_their_rows

    def seqs(acceptance: float, n: int) -> list:
        drafter = Drafter([1], 15)
        drafter._accepted, drafter._tried = acceptance, 1.0
        return [SimpleNamespace(drafter=drafter)] * n

    assert _worth_their_rows(seqs(0.99, 1), [[7] * 15]) == [[7] * 15]
    assert _worth_their_rows(seqs(0.6, 16), [[7]] * 16) == [[]] * 16  # a full batch: a row costs a token
    assert _worth_their_rows(seqs(0.99, 16), [[7] * 15] * 16) == [[]] * 16  # a full batch runs as plain
    assert sum(map(len, _worth_their_rows(seqs(0.99, 4), [[7] * 3] * 4))) == 12  # up to 16 rows
    assert _worth_their_rows(seqs(0.05, 1), [[7]]) == [[7]]  # a probe, where a row is cheap
    assert _worth_their_rows(seqs(0.05, 4), [[7]] * 4) == [[]] * 4
    assert _worth_their_rows(seqs(0.05, 3), [[7]] * 3) == [[7], [], []]  # one probe: 4 rows


def test_a_draft_is_kept_only_where_it_slows_no_sequence_in_the_step():
    """With a fifth row nearly free (a Zen 4's float32 rows), keeping one proven copier's draft
    beside three sequences without one would raise the step's tokens per unit of cost, and slow
    the three: it is dropped. Four copiers draft together; one poor draft among them drops all,
    or cuts them to a length its acceptance pays for."""
    from types import SimpleNamespace

    from batchproof.engine.speculative.propose import _worth_their_rows

    def seq(acceptance: float):
        drafter = Drafter([1], 15)
        drafter._accepted, drafter._tried, drafter.num_proposed = acceptance, 1.0, 8
        return SimpleNamespace(drafter=drafter)

    def cheap(rows: int) -> float:  # each row after the first ~0.3 of a one-row step
        return 1.0 + 0.3 * (rows - 1)

    copier, free = seq(0.99), seq(0.3)
    assert _worth_their_rows([copier, free, free, free], [[7] * 3, [], [], []], cheap) == [[]] * 4
    assert _worth_their_rows([copier] * 4, [[7] * 3] * 4, cheap) == [[7] * 3] * 4
    assert _worth_their_rows([copier, copier, copier, free], [[7] * 3] * 4, cheap) == [[]] * 4
    two = _worth_their_rows([copier, seq(0.9)], [[7] * 7, [7] * 3], cheap)
    assert two in ([[7] * 7, [7] * 3], [[7] * 3, [7] * 3])  # cut to the shorter where that pays more
    assert _worth_their_rows([copier], [[7] * 7], cheap) == [[7] * 7]  # alone: its own gain pays


def test_a_shadow_draft_the_step_did_not_verify_is_checked_against_the_token_chosen_instead():
    """Shadows: in a batch too full for probes, each sequence's unverified draft is compared with
    the tokens the step chose, so its acceptance is measured at no cost; no back-off on a miss
    (a shadow cost no row), and a grammar's forced tokens are not evidence."""
    copier = Drafter([5, 6, 7, 8, 5, 6, 7], 15)
    assert copier.is_probing and copier.acceptance == 0.5
    reply: list[int] = []
    for token in (8, 5, 6, 7, 8, 5):
        draft = copier.propose(reply, room=15)
        assert draft, reply
        copier.shadow(draft, len(reply))
        reply.append(token)  # the step chose the draft's first token
    copier.propose(reply, room=15)
    assert copier.num_shadowed == 6 and copier.num_proposed == 0
    assert copier.acceptance > 0.9 and not copier.is_probing
    misses, reply = Drafter([5, 6, 7, 8, 5, 6, 7], 15), []
    for token in (1, 1, 1):
        misses.shadow(misses.propose(reply, room=15) or [9], len(reply))
        reply.append(token)  # never the draft's
    misses.propose(reply, room=15)
    assert misses.acceptance < 0.2 and misses._wait == 0
    forced = Drafter([1], 15)
    forced.propose([], room=5, forced=[4, 4])
    forced.shadow([4, 4], 0)
    forced.propose([4], room=5)
    assert forced.num_shadowed == 0


def test_step_costs_follow_this_engine_s_timings():
    """The table until timed; then each measured row count's median (one slow step ignored), and
    the table's shape between and past them. A dearer 2-row step here drafts less."""
    from batchproof.engine.draft.cost import StepCost, step_cost

    cost = StepCost()
    assert [cost(r) for r in (1, 2, 4, 16, 40)] == [step_cost(r) for r in (1, 2, 4, 16, 40)]
    for _ in range(5):
        cost.observe(1, 0.010)
    assert cost(2) == step_cost(2)  # only one row count known: nothing to compare
    for seconds in (0.015, 0.015, 0.150, 0.015):  # a busy machine's odd step
        cost.observe(2, seconds)
    assert cost(2) == pytest.approx(1.5)
    assert cost(4) == pytest.approx(step_cost(4) * 1.5 / step_cost(2))  # past the last measured: its correction
    for _ in range(3):
        cost.observe(4, 0.018)
    assert cost(4) == pytest.approx(1.8)
    assert cost(3) == pytest.approx(step_cost(3) * (1.5 / step_cost(2) + 1.8 / step_cost(4)) / 2)  # between

    cheap, dear = Drafter([1, 2, 1, 2, 1, 2], 15), Drafter([1, 2, 1, 2, 1, 2], 15, cost)
    for drafter in (cheap, dear):
        accept(drafter, 4, 1, 1)
        accept(drafter, 4, 1, 0)  # half of the drafted tokens taken
    assert not cheap.is_probing and dear.is_probing  # 1.5 tokens: worth 1.17 steps, not 1.5


# --- alone: speculative == plain ------------------------------------------------------------

@pytest.mark.parametrize("text", [EDIT, EXTRACT, FREE])
def test_greedy_alone_is_bitwise_plain_decoding(engine, plain, text):
    ids = chat(engine, text)
    spec = alone(engine, ids, greedy(cache_namespace=None))
    assert signature(spec) == signature(alone(plain, ids, greedy()))
    if text is EDIT:  # copying: the path under test is the verifying one
        assert spec[-1].num_accepted_tokens > 0
        assert spec[-1].num_accepted_tokens <= spec[-1].num_draft_tokens


def test_the_engine_times_its_decode_steps_by_row_count(engine):
    """Every decode step's rows (its sequences and their drafts) are timed into the engine's
    step costs."""
    ids = chat(engine, EDIT)
    alone(engine, ids, greedy(max_tokens=48, cache_namespace=None))
    assert engine.step_cost.rows_timed[0] == 1 and len(engine.step_cost.rows_timed) > 1  # drafts were verified
    assert engine.step_cost.rows_timed[-1] <= 16


@pytest.mark.parametrize("seed", [0, 1])
def test_seeded_sampling_alone_is_bitwise_plain_decoding(engine, plain, seed):
    """One draw per emitted token, in order: a position's draw never depends on how many
    positions a step verified."""
    ids = chat(engine, EDIT)
    spec = alone(engine, ids, seeded(seed))
    assert signature(spec) == signature(alone(plain, ids, seeded(seed)))
    assert spec[-1].num_accepted_tokens > 0


@pytest.mark.parametrize("max_tokens", [1, 5, 17])
def test_max_tokens_inside_an_accepted_run_ends_where_plain_decoding_does(engine, plain, max_tokens):
    ids = chat(engine, EDIT)
    spec = alone(engine, ids, greedy(max_tokens, ignore_eos=True))
    assert signature(spec) == signature(alone(plain, ids, greedy(max_tokens, ignore_eos=True)))
    assert spec[-1].num_output_tokens == max_tokens


@pytest.mark.parametrize("stop", ["twelve"])
def test_a_stop_string_inside_an_accepted_run_ends_where_plain_decoding_does(engine, plain, stop):
    ids = chat(engine, EDIT)
    spec = alone(engine, ids, greedy(stop=(stop,)))
    assert signature(spec) == signature(alone(plain, ids, greedy(stop=(stop,))))
    assert spec[-1].finish_reason == "stop"


def test_the_end_of_turn_inside_an_accepted_run_ends_where_plain_decoding_does(engine, plain):
    """The copy ends with the passage: the end of turn comes right after a drafted run."""
    ids = chat(engine, f"Repeat exactly: {PASSAGE}")
    spec = alone(engine, ids, greedy(200))
    assert signature(spec) == signature(alone(plain, ids, greedy(200)))
    assert spec[-1].finish_reason == "stop" and spec[-1].num_accepted_tokens > 0


def test_under_a_json_schema_every_position_is_masked_as_plain_decoding_masks_it(engine, plain):
    ids = chat(engine, EXTRACT)
    for params in (greedy(80, constraint=grammars.json_schema(SCHEMA)),
                   seeded(4, 80, constraint=grammars.json_schema(SCHEMA), logprobs_mode="processed")):
        spec = alone(engine, ids, params)
        assert signature(spec) == signature(alone(plain, ids, params))
        json.loads("".join(o.text for o in spec))


ODD_KEYS = {"type": "object", "properties": {"zq_tally_of_gulls": {"type": "integer"}, "zq_wind": {"type": "integer"}},
            "required": ["zq_tally_of_gulls", "zq_wind"], "additionalProperties": False}


def test_a_grammar_s_forced_tokens_are_offered_as_a_draft(engine):
    """After its mask, a grammar says which tokens no other choice could follow: a JSON schema's
    first key, its quotes and colon; the drafter proposes them first, with no wait, and they say
    nothing about how well the reply copies (the acceptance estimate is left as it was)."""
    from batchproof.engine.grammar.state import GrammarState
    state = GrammarState(engine.tokenizer, grammars.json_schema(ODD_KEYS).grammar)
    state.allowed(10.0)  # the first mask (and what it forces)
    forced = state.forced()
    assert "zq_tally_of_gulls" in engine.tokenizer.decode(forced)
    drafter = Drafter([1, 2, 3], 15)
    drafter._wait = 5  # as after misses: a lookup draft would wait
    assert drafter.propose([], room=4, forced=forced) == forced[:4] and drafter.num_forced == min(4, len(forced))
    before = drafter.acceptance
    drafter.observe(drafter.num_forced, drafter.num_forced)
    assert drafter.acceptance == before and drafter.num_forced == 0


def test_keys_found_nowhere_in_the_prompt_are_drafted_from_the_grammar_bitwise(engine, plain, monkeypatch):
    """A schema's keys are in no prompt (the server does not write them there): prompt lookup has
    nothing to match, the grammar's forced tokens are the drafts, accepted, and the reply is
    plain decoding's, bit for bit. The wait for them is made long, so a busy machine (a grammar
    worker late by more than the 5 ms a step gives it) cannot leave the drafts out, and the step
    costs are the table's (_TableOnly): in CI, beside another test file's worker, this engine's
    earlier steps had timed slow enough that two of the keys' drafts did not pay (6 accepted)."""
    monkeypatch.setattr("batchproof.engine.grammar.state.FORCED_WAIT_S", 10.0)
    monkeypatch.setattr(engine, "step_cost", _TableOnly())
    ids = chat(engine, "Count the gulls and the wind, as JSON.")
    params = greedy(40, constraint=grammars.json_schema(ODD_KEYS))
    spec = alone(engine, ids, params)
    assert signature(spec) == signature(alone(plain, ids, params))
    assert spec[-1].num_accepted_tokens >= 8  # the two keys' tokens, at least


def test_penalties_read_the_tokens_accepted_before_each_position(engine, plain):
    ids = chat(engine, EDIT)
    params = SamplingParams(temperature=0.0, max_tokens=48, top_logprobs=TOP, repetition_penalty=1.3,
                            frequency_penalty=0.5, logit_bias={13: 2.0})
    assert signature(alone(engine, ids, params)) == signature(alone(plain, ids, params))


# --- in a batch -----------------------------------------------------------------------------

def mixed_batch(engine, size: int) -> dict:
    """`size` requests, each its own draft length every step: copying, extraction under a
    schema, free text; greedy and seeded; some with stop strings."""
    prompts = [chat(engine, text) for text in (EDIT, EXTRACT, FREE, f"Repeat exactly: {PASSAGE}")]
    requests = {}
    for i in range(size):
        kind = i % 4
        extra = {"constraint": grammars.json_schema(SCHEMA)} if kind == 1 and i % 8 == 1 else {}
        if i % 5 == 3:
            extra["stop"] = ("twelve",)
        params = greedy(40, **extra) if i % 3 else seeded(i, 40, **extra)
        requests[f"b{i}"] = (prompts[kind], params)
    return requests


@pytest.mark.parametrize("size", [3, 16])
def test_a_mixed_batch_is_bitwise_each_alone_and_plain(engine, plain, size):
    """At 3 the sequences draft side by side (unproven ones as probes while the step stays within
    4 rows; proven ones where every sequence in the step drafts and the least promising pays
    for the rows); at 16 a full batch drafts only while some prompts are still being fed
    (propose.py)."""
    requests = mixed_batch(engine, size)
    together = engine.generate(requests)
    if size == 3:
        assert sum(outs[-1].num_accepted_tokens for outs in together.values()) > 0
    for request_id, (ids, params) in requests.items():
        expected = signature(alone(plain, ids, params, request_id))
        assert signature(together[request_id]) == expected, request_id
        if size == 3:  # (alone speculative == plain has its own tests above; a batch of 16 is the cost)
            assert signature(alone(engine, ids, params, request_id)) == expected, request_id


class _TableOnly(StepCost):
    """The cost table, never bent by this run's timings: on a busy machine a few slow steps could
    make a batch's drafts look dear, and which drafts pay is not what the tests using it ask."""

    def observe(self, rows: int, seconds: float) -> None:
        pass


def test_four_identical_copying_prompts_at_once_draft_together_and_stay_bitwise(engine, plain, monkeypatch):
    """c=4 (the witness's band): a batch too full for probes learns from shadows that every
    sequence copies, then verifies the four drafts in one step where they pay for its rows
    (propose.py); each reply bitwise the same request alone without speculation."""
    monkeypatch.setattr(engine, "step_cost", _TableOnly())
    ids = chat(engine, EDIT)
    together = engine.generate({f"c{i}": (ids, greedy(60)) for i in range(4)})
    expected = signature(alone(plain, ids, greedy(60)))
    for request_id, outs in together.items():
        assert outs[-1].num_accepted_tokens > 0, request_id
        assert signature(outs) == expected, request_id


def test_a_request_joining_a_speculating_batch_is_bitwise_alone(engine, plain):
    """A newcomer's prefill steps interleave with the running sequences' verify steps."""
    ids = chat(engine, EDIT)
    engine.add_request("first", ids, greedy(60))
    outs: dict[str, list] = {"first": [], "late": []}
    for _ in range(3):
        for out in engine.step():
            outs[out.request_id].append(out)
    engine.add_request("late", chat(engine, f"Repeat exactly: {PASSAGE}"), seeded(7, 60))
    while engine.has_work():
        for out in engine.step():
            outs[out.request_id].append(out)
    engine.take_batch_summary()
    assert signature(outs["first"]) == signature(alone(plain, ids, greedy(60)))
    assert signature(outs["late"]) == signature(alone(plain, chat(engine, f"Repeat exactly: {PASSAGE}"),
                                                      seeded(7, 60)))


# --- the prefix cache -----------------------------------------------------------------------

def test_rejected_drafts_never_reach_the_prefix_cache(engine, plain):
    """A reply with rejected drafts retires into the cache (its whole blocks of prompt and
    reply); a follow-up whose prompt holds that reply is served those blocks, warm, and gets
    the bits of a cold engine that never speculated."""
    ids = chat(engine, EDIT)
    first = alone(engine, ids, greedy(64, ignore_eos=True), "first")
    assert 0 < first[-1].num_accepted_tokens < first[-1].num_draft_tokens  # some drafts were rejected
    reply = [i for o in first for i in o.token_ids]
    follow_up = ids + reply + chat(engine, "Now say it again.")[1:]
    warm = alone(engine, follow_up, greedy(24), "warm")
    assert warm[-1].num_cached_tokens >= 16 * ((len(ids) + len(reply)) // 16) - 16
    assert signature(warm) == signature(alone(plain, follow_up, greedy(24)))


def test_warm_and_cold_prefix_cache_give_the_same_bits(engine, plain):
    ids = chat(engine, f"Repeat exactly: {PASSAGE}")
    cold = alone(engine, ids, seeded(11, 48, cache_namespace=None))
    warm_once = alone(engine, ids, seeded(11, 48))
    warm_twice = alone(engine, ids, seeded(11, 48))
    assert warm_twice[-1].num_cached_tokens > 0
    expected = signature(alone(plain, ids, seeded(11, 48)))
    assert signature(cold) == signature(warm_once) == signature(warm_twice) == expected


# --- off where it cannot be exact, and off when asked ---------------------------------------

def test_off_when_asked_and_said_so(plain):
    assert plain.info()["speculative"] == {"enabled": False, "reason": "off (--no-speculative)"}
    out = alone(plain, chat(plain, EDIT), greedy(16))
    assert out[-1].num_draft_tokens == 0


# --- the second model -----------------------------------------------------------------------

@pytest.mark.usefixtures("gemma_package")
def test_gemma_copying_is_bitwise_plain_decoding():
    """A base model (no chat template): a prompt that sets up a repetition."""
    from pathlib import Path
    config = dict(model_path=Path("gemma3-270m"), device="cpu", max_batch=4, max_model_len=512)
    spec = Engine(EngineConfig(**config))
    ref = Engine(EngineConfig(**config, speculative=False, prefix_cache=False))
    ids = [spec.tokenizer.ids.bos_id, *spec.tokenizer.encode(f"Text: {PASSAGE}\n\nThe same text, repeated:\n")]
    for params in (greedy(48), seeded(5, 48)):
        out = alone(spec, ids, params)
        assert signature(out) == signature(alone(ref, ids, params))
    assert out[-1].num_accepted_tokens > 0


@pytest.mark.usefixtures("gemma_package")
def test_gemma_a_batch_of_16_mixed_requests_is_bitwise_each_alone_and_plain():
    """The second model in a batch of 16: copying prompts (which draft while the batch is short of
    full, as its prompts are still being fed) beside free ones, greedy and seeded, top-20."""
    from pathlib import Path
    config = dict(model_path=Path("gemma3-270m"), device="cpu", max_batch=16, max_model_len=512)
    spec = Engine(EngineConfig(**config))
    ref = Engine(EngineConfig(**config, speculative=False, prefix_cache=False))
    bos = spec.tokenizer.ids.bos_id
    prompts = [[bos, *spec.tokenizer.encode(f"Text: {PASSAGE}\n\nThe same text, repeated:\n")],
               [bos, *spec.tokenizer.encode("The capital of France is")],
               [bos, *spec.tokenizer.encode("One, two, three, four, five, six,")]]
    requests = {f"g{i}": (prompts[i % 3], greedy(24) if i % 2 else seeded(i, 24)) for i in range(16)}
    together = spec.generate(requests)
    for request_id, (ids, params) in requests.items():
        assert signature(together[request_id]) == signature(alone(ref, ids, params, request_id)), request_id
