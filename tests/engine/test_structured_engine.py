"""The engine under a grammar: batch invariance with the mask per sequence, raw logprobs that
are the model's own (scoring the reply afterwards gives the same bits), and the mask itself."""

import json
import struct

import jsonschema
import pytest

from batchproof.engine.grammar import compile as grammars
from batchproof.engine.grammar.state import unpack_mask
from batchproof.engine.sampling.params import SamplingParams
from tests.server.test_structured_output import PET_SCHEMA, PROMPT


def _signature(outputs) -> list:
    return [(r.token_id, r.logprob, r.top) for o in outputs for r in o.records] + [outputs[-1].finish_reason]


def test_unpack_mask_reads_llguidances_bit_order() -> None:
    words = struct.pack("<II", 1 | (1 << 31), 1 << 2)  # tokens 0, 31 and 34
    allowed = unpack_mask(words, 40)
    assert allowed.nonzero().flatten().tolist() == [0, 31, 34]


def test_a_mixed_batch_of_16_is_bitwise_each_alone(engine) -> None:
    """Half constrained (two schemas, greedy and seeded, raw and processed), half free."""
    ids = engine.chat_prompt_ids([{"role": "user", "content": PROMPT}])
    pet, obj = grammars.json_schema(PET_SCHEMA), grammars.json_object()
    requests = {}
    for i in range(16):
        requests[f"r{i}"] = (ids, SamplingParams(temperature=0 if i % 3 else 0.9, seed=i, max_tokens=24,
                                                 top_logprobs=2, constraint=(pet, obj, None, None)[i % 4],
                                                 logprobs_mode="processed" if i % 5 == 0 else "raw"))
    together = engine.generate(requests)
    for request_id, request in requests.items():
        alone = engine.generate({request_id: request})[request_id]
        assert _signature(alone) == _signature(together[request_id]), request_id


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_raw_logprobs_equal_scoring_the_reply_afterwards(engine, temperature: float) -> None:
    """Raw logprobs under a grammar are the model's distribution: scoring prompt + the reply's
    token ids (prompt logprobs, which no mask touches) gives them bit for bit."""
    ids = engine.chat_prompt_ids([{"role": "user", "content": PROMPT}])
    params = SamplingParams(temperature=temperature, seed=3, max_tokens=80, top_logprobs=3,
                            constraint=grammars.json_schema(PET_SCHEMA))
    outputs = engine.generate({"gen": (ids, params)})["gen"]
    records = [r for o in outputs for r in o.records]
    assert outputs[-1].finish_reason == "stop"
    jsonschema.validate(json.loads("".join(o.text for o in outputs)), PET_SCHEMA)
    reply_ids = [r.token_id for r in records]
    scored = engine.generate({"score": (ids + reply_ids, SamplingParams(max_tokens=0, prompt_logprobs=3))})
    prompt_records = scored["score"][0].prompt_records[len(ids):]
    assert [(r.token_id, r.logprob, r.top) for r in prompt_records] == [(r.token_id, r.logprob, r.top)
                                                                        for r in records]
