"""A large body's lists are counted on its parsed JSON before pydantic validates it (validation
holds the GIL: 1,500,000 prompts took 1.3 s of it). Each refusal names the field, and the
validator is never reached; a small body, and a flat list of token ids, pass straight on."""

import json

import pytest
from pydantic import BaseModel

from batchproof.server.chat.protocol import ChatCompletionRequest
from batchproof.server.completions.protocol import CompletionRequest
from batchproof.server.errors import APIError
from batchproof.server.guards import precount as counting
from batchproof.server.responses.protocol import ResponsesRequest
from batchproof.server.state import parse_body

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
PART = {"type": "text", "text": "a"}
# (model, body, field named, or None where the JSON budgets refuse it before it is parsed)
HUGE = [
    (CompletionRequest, {"prompt": ["a"] * 1_500_000, "max_tokens": 1}, None),
    (CompletionRequest, {"prompt": ["a"] * 70_000, "max_tokens": 1}, "prompt"),
    (CompletionRequest, {"prompt": [[1]] * 70_000, "max_tokens": 1}, "prompt"),
    (ChatCompletionRequest, {"messages": [{"role": "tool", "tool_call_id": "c", "content": "r"}] * 140_000}, None),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}], "tools": [TOOL] * 20_000}, None),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}], "tools": [TOOL] * 2_000}, "tools"),
    (ResponsesRequest, {"input": "hi", "metadata": {f"k{i}": "v" for i in range(300_000)}}, None),
    (ResponsesRequest, {"input": "hi", "metadata": {f"k{i}": "v" for i in range(100_000)}}, "metadata"),
    (ResponsesRequest, {"input": [{"role": "user", "content": "x"}] * 70_000}, None),
    # Issue 58's: nested where no field count reached them
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": [PART] * 288_938}]}, None),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}], "stop": ["a"] * 1_500_000}, None),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}], "prompt_token_ids": [1] * 700_000},
     None),
]


@pytest.mark.parametrize(("model", "body", "field"), HUGE,
                         ids=[f"{m.__name__}.{f}.{i}" for i, (m, _, f) in enumerate(HUGE)])
def test_a_huge_body_is_refused_before_validation(model: type[BaseModel], body: dict, field: str | None,
                                                  monkeypatch) -> None:
    def never(*args, **kwargs):
        raise AssertionError("validated before the count")

    monkeypatch.setattr(model, "model_validate_json", never)
    if field is None:  # not even parsed
        monkeypatch.setattr(counting.pydantic_core, "from_json", never)
    with pytest.raises(APIError) as refused:
        parse_body(model, json.dumps(body).encode())
    assert refused.value.status == 400 and refused.value.param == field
    assert "at most" in str(refused.value.message)
    if field is None:
        assert "JSON objects" in refused.value.message or "JSON values" in refused.value.message


def test_brackets_and_commas_inside_strings_are_not_counted() -> None:
    text = 'a, {b}, [c], \\"quoted\\" and a backslash \\\\ ' * 20_000  # 700 KB of prose full of them
    body = json.dumps({"prompt": text, "max_tokens": 1}).encode()
    assert body.count(b"{") > counting.MAX_JSON_OBJECTS and body.count(b",") > counting.MAX_JSON_VALUES / 10
    assert parse_body(CompletionRequest, body).prompt == text
    small = json.dumps({"prompt": text[:5000], "max_tokens": 1}).encode()
    # the same with the slices cut anywhere: a quote, an escape or a bracket at any boundary
    for size in (1, 2, 3, 7, 64):
        counting.SCAN_SLICE_BYTES, saved = size, counting.SCAN_SLICE_BYTES
        try:
            assert counting._count_structure_outside_strings(small) == (1, 2, 3)
        finally:
            counting.SCAN_SLICE_BYTES = saved


def test_a_bias_over_131072_tokens_fits_the_budget_and_twice_that_is_refused_unparsed(monkeypatch) -> None:
    def body(num: int) -> bytes:
        return json.dumps({"messages": [{"role": "user", "content": "hi"}],
                           "logit_bias": {str(i): 1.0 for i in range(num)}}).encode()

    assert len(parse_body(ChatCompletionRequest, body(131_000)).logit_bias) == 131_000
    monkeypatch.setattr(counting.pydantic_core, "from_json", lambda *a: pytest.fail("parsed"))
    with pytest.raises(APIError) as refused:
        parse_body(ChatCompletionRequest, body(262_144))
    assert "262148 members of JSON objects" in refused.value.message


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
