"""Large replies are encoded in pieces off the event loop (server/reply/json_body.py): the same bytes
as Starlette's JSONResponse, whatever the shape; the tokenize route and whole replies use it."""

import json
import random

import pytest
from starlette.responses import JSONResponse

from batchproof.server.reply import json_body
from tests.helpers.http import post

SCALARS = [0, -1.5, 1e-300, "é\u2028\"x\\", None, True, "", 7, [], {}]


def _reply_like(rng: random.Random, depth: int = 0):
    """Dicts and short lists nested a few deep, a long list (sliced) here and there of small items."""
    roll = rng.random()
    if depth > 3 or roll < 0.3:
        return rng.choice(SCALARS)
    if roll < 0.45:  # long: its items small, as a reply's logprob entries are
        return [{"t": rng.choice(SCALARS), "top": [rng.choice(SCALARS)] * 3} for _ in range(rng.choice([9, 2500]))]
    if roll < 0.7:
        return [_reply_like(rng, depth + 1) for _ in range(rng.choice([0, 1, 3, 8]))]
    return {f"k{i}é": _reply_like(rng, depth + 1) for i in range(rng.randint(0, 4))}


@pytest.mark.parametrize("seed", range(20))
def test_the_bytes_are_json_responses(seed: int) -> None:
    value = _reply_like(random.Random(seed))
    assert json_body.encode_json(value) == JSONResponse(value).body


def test_a_long_list_is_encoded_a_slice_at_a_time(monkeypatch) -> None:
    calls = []
    dumps = json_body._dumps
    monkeypatch.setattr(json_body, "_dumps", lambda value: calls.append(value) or dumps(value))
    entries = [{"token": str(i), "logprob": -0.5, "top_logprobs": [{"token": "a", "logprob": -1.0}] * 20}
               for i in range(10_000)]
    value = {"choices": [{"logprobs": {"content": entries}}]}
    assert json.loads(json_body.encode_json(value)) == value
    assert max(len(c) for c in calls if isinstance(c, list)) == json_body.SLICE_ITEMS


def test_tokenize_with_token_strings_is_the_same_reply(server) -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 2000
    reply = post(server.url, "/tokenize", {"prompt": text, "return_token_strs": True})
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
    body = reply.json()
    assert body["count"] == len(body["tokens"]) == len(body["token_strs"]) > 10_000
    assert "".join(body["token_strs"]).replace("Ġ", " ").startswith("The quick")
