"""A large body's lists are counted on its parsed JSON before pydantic validates it (validation
holds the GIL: 1,500,000 prompts took 1.3 s of it). Each refusal names the field, and the
validator is never reached; a small body, and a flat list of token ids, pass straight on."""

import json

import pytest
from pydantic import BaseModel

from batchproof.server import precount as counting
from batchproof.server.errors import APIError
from batchproof.server.protocol import ChatCompletionRequest, CompletionRequest
from batchproof.server.responses.protocol import ResponsesRequest
from batchproof.server.state import parse_body

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
HUGE = [
    (CompletionRequest, {"prompt": ["a"] * 1_500_000, "max_tokens": 1}, "prompt"),
    (CompletionRequest, {"prompt": [[1]] * 70_000, "max_tokens": 1}, "prompt"),
    (ChatCompletionRequest, {"messages": [{"role": "tool", "tool_call_id": "c", "content": "r"}] * 140_000},
     "messages"),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}], "tools": [TOOL] * 20_000}, "tools"),
    (ResponsesRequest, {"input": "hi", "metadata": {f"k{i}": "v" for i in range(300_000)}}, "metadata"),
    (ResponsesRequest, {"input": [{"role": "user", "content": "x"}] * 70_000}, "input"),
]


@pytest.mark.parametrize(("model", "body", "field"), HUGE, ids=[f"{m.__name__}.{f}" for m, _, f in HUGE])
def test_a_huge_list_is_refused_before_validation(model: type[BaseModel], body: dict, field: str,
                                                  monkeypatch) -> None:
    def never(*args, **kwargs):
        raise AssertionError("validated before the count")

    monkeypatch.setattr(model, "model_validate_json", never)
    with pytest.raises(APIError) as refused:
        parse_body(model, json.dumps(body).encode())
    assert refused.value.status == 400 and refused.value.param == field
    assert "at most" in str(refused.value.message)


def test_what_the_count_passes_is_validated_as_before() -> None:
    ids = json.dumps({"prompt": list(range(40_000)), "max_tokens": 1}).encode()  # one prompt of ids
    assert len(ids) > counting.PRECOUNT_FROM_BYTES
    assert parse_body(CompletionRequest, ids).prompt == list(range(40_000))
    small = json.dumps({"prompt": ["a"] * 100, "max_tokens": 1}).encode()
    assert len(small) < counting.PRECOUNT_FROM_BYTES and len(parse_body(CompletionRequest, small).prompt) == 100
    broken = b'{"prompt": [' + b'"a", ' * 20_000 + b"]"  # not JSON: validation names the problem
    with pytest.raises(APIError) as refused:
        parse_body(CompletionRequest, broken)
    assert refused.value.status == 400
