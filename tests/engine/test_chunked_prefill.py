"""A long prompt is fed in short steps between the others' decode steps, with bitwise the tokens,
logprobs and prompt logprobs it gets when it is prefilled alone in one go; how a step's budget is
paced and shared."""

import pytest

from batchproof.engine.model.ops import kernels
from batchproof.engine.sampling.params import SamplingParams
from batchproof.engine.scheduler import FIRST_BUDGET, PrefillPacer, allot_prefill

LONG = ("The harbour master kept a ledger of every ship that came past the breakwater: its name, its "
        "flag, its cargo and the hour of the tide. ") * 8
SHORT = "Count from one to twenty."


def _records(deltas) -> list:
    return [(r.token_id, r.logprob, r.top) for d in deltas for r in d.records]


@pytest.mark.skipif(not kernels.available(), reason="any chunking keeps the bits only with our kernels")
def test_a_long_prompt_interleaves_with_decoding_and_keeps_its_bits(engine, monkeypatch) -> None:
    prompt = engine.tokenizer.encode(LONG)
    assert len(prompt) > 4 * FIRST_BUDGET
    params = SamplingParams(temperature=0, max_tokens=4, top_logprobs=3, prompt_logprobs=2,
                            cache_namespace=None)  # no prefix cache: both runs compute every position
    alone = engine.generate({"long": (prompt, params)})["long"]

    # Count the prompt tokens each step feeds, and who decodes between them.
    fed: list[int] = []
    prefill = engine.model.prefill

    def counting_prefill(segments, cache, *routing):
        fed[-1] += sum(len(s.token_ids) for s in segments)
        return prefill(segments, cache, *routing)

    monkeypatch.setattr(engine.model, "prefill", counting_prefill)
    # A fixed budget beside decoding sequences: the pacer follows the clock (its own test
    # below), and this test must not depend on how fast the machine is.
    pacer = engine.scheduler.pacer
    monkeypatch.setattr(pacer, "budget", lambda is_decoding: 40 if is_decoding else pacer.max_tokens)
    others = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True, cache_namespace=None)
    for i in range(3):
        engine.add_request(f"other-{i}", engine.tokenizer.encode(SHORT), others)
    kinds = []
    while len(engine.scheduler.running) < 3 or any(s.is_prefilling for s in engine.scheduler.running):
        fed.append(0)
        engine.step()
    engine.add_request("long", prompt, params)
    together = []
    while not together or together[-1].finish_reason is None:
        fed.append(0)
        outputs = engine.step()
        kinds.append("prefill" if fed[-1] else "decode")
        together += [out for out in outputs if out.request_id == "long"]
    for i in range(3):
        engine.abort(f"other-{i}")
    while engine.has_work():
        engine.step()
    engine.take_batch_summary()
    # The prompt took many prefill steps, and the others decoded between every two of them.
    assert kinds.count("prefill") > 1 and max(fed) < len(prompt)
    assert ("prefill", "prefill") not in set(zip(kinds, kinds[1:]))
    assert _records(together) == _records(alone)
    assert together[0].prompt_records == alone[0].prompt_records


class _Prompt:
    def __init__(self, length: int, computed: int = 0) -> None:
        self.prompt_ids, self.num_computed = [0] * length, computed
        self.prefill_len = length  # what prefill feeds (a refill after a keep-mode swap feeds more)


def test_the_budget_goes_half_to_the_oldest_then_to_the_shortest() -> None:
    alone = _Prompt(5000, computed=1000)
    assert allot_prefill([alone], 32) == ([alone], [32])
    assert allot_prefill([_Prompt(10)], 32)[1] == [10]
    long, mid, short = _Prompt(5000), _Prompt(40), _Prompt(9)
    # The newcomers behind a long prompt get the other half, shortest first; none starves.
    assert allot_prefill([long, mid, short], 32) == ([long, mid, short], [16, 7, 9])
    assert allot_prefill([long, short], 32) == ([long, short], [23, 9])  # the rest goes back to the oldest
    assert allot_prefill([short, long], 2048) == ([short, long], [9, 2039])
    seqs, tokens = allot_prefill([long, mid, short], 1)
    assert seqs == [long] and tokens == [1]


def test_a_prefill_step_takes_its_share_of_a_decode_steps_time() -> None:
    pacer = PrefillPacer(share=0.5, max_tokens=2048)
    assert pacer.budget(is_decoding=False) == 2048  # nobody waits: whole chunks
    assert pacer.budget(is_decoding=True) == FIRST_BUDGET  # nothing timed yet
    pacer.observe_decode(0.100)
    pacer.observe_prefill(32, 0.064)  # 500 tokens/s near the start of a prompt
    assert pacer.budget(is_decoding=True) == 25  # 0.5 x 0.1 s x 500 /s
    pacer.observe_prefill(25, 0.5)  # deep in a long prompt: 50 tokens/s
    assert pacer.budget(is_decoding=True) == 2
    pacer.observe_prefill(2, 1.0)  # slower still: one token a step, never none
    assert pacer.budget(is_decoding=True) == 1
