"""A long prompt is fed in bounded chunks while others decode, with bitwise the tokens, logprobs
and prompt logprobs it gets when it is prefilled alone in one go."""

import pytest

from batchproof.engine.model.ops import kernels
from batchproof.engine.sampling_params import SamplingParams
from batchproof.engine.scheduler import PREFILL_FLOOR

LONG = ("The harbour master kept a ledger of every ship that came past the breakwater: its name, its "
        "flag, its cargo and the hour of the tide. ") * 14
SHORT = "Count from one to twenty."


def _records(deltas) -> list:
    return [(r.token_id, r.logprob, r.top) for d in deltas for r in d.records]


@pytest.mark.skipif(not kernels.available(), reason="any chunking keeps the bits only with our kernels")
def test_a_long_prompt_interleaves_with_decoding_and_keeps_its_bits(engine, monkeypatch) -> None:
    prompt = engine.tokenizer.encode(LONG)
    assert len(prompt) > 8 * PREFILL_FLOOR
    params = SamplingParams(temperature=0, max_tokens=4, top_logprobs=3, prompt_logprobs=2,
                            cache_namespace=None)  # no prefix cache: both runs compute every position
    alone = engine.generate({"long": (prompt, params)})["long"]

    # Count the prompt tokens each step feeds, and who decodes between them.
    fed: list[int] = []
    prefill = engine.model.prefill

    def counting_prefill(segments, cache):
        fed[-1] += sum(len(s.token_ids) for s in segments)
        return prefill(segments, cache)

    monkeypatch.setattr(engine.model, "prefill", counting_prefill)
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
        decoding = sum(not s.is_prefilling for s in engine.scheduler.running)
        outputs = engine.step()
        kinds.append("prefill" if fed[-1] else "decode")
        if fed[-1]:
            assert fed[-1] <= max(PREFILL_FLOOR, 2 * decoding), "a prefill step overran its budget"
        together += [out for out in outputs if out.request_id == "long"]
    for i in range(3):
        engine.abort(f"other-{i}")
    while engine.has_work():
        engine.step()
    engine.take_batch_summary()
    # The prompt took many prefill steps, and the others decoded between every two of them.
    assert kinds.count("prefill") >= len(prompt) // max(PREFILL_FLOOR, 6)
    assert ("prefill", "prefill") not in set(zip(kinds, kinds[1:]))
    assert _records(together) == _records(alone)
    assert together[0].prompt_records == alone[0].prompt_records
