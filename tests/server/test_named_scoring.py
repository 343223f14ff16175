"""Teacher scoring and tails (docs/api-fields.md): vLLM's `prompt_logprob_token_ids` gives the
same bits as the named token's entry in a full top-K of the same position; `return_tail_logprobs`
gives each entry the mass outside its alternatives, which with them sums to one; bad rows are a
400 naming the field and the value."""

import math

import pytest

from tests.helpers.http import messages, post

COMPLETIONS = "/v1/completions"
PROMPT = "The capital of France is Paris, and the capital of Italy is"
K = 5


def _prompt_ids(url: str) -> list[int]:
    reply = post(url, COMPLETIONS, {"prompt": PROMPT, "max_tokens": 1, "return_token_ids": True, "temperature": 0})
    return reply.json()["choices"][0]["prompt_token_ids"]


def _top_k(url: str, ids: list[int]) -> list[dict]:
    """Each position's prompt_logprobs entry at top K (vLLM's shape: {id: {logprob, rank}})."""
    body = {"prompt": ids, "max_tokens": 1, "prompt_logprobs": K, "temperature": 0}
    return post(url, COMPLETIONS, body).json()["choices"][0]["prompt_logprobs"]


@pytest.mark.parametrize("start", [0, 4])
def test_named_tokens_equal_the_same_tokens_in_a_full_top_k(server, start):
    url = server.url
    ids = _prompt_ids(url)
    full = _top_k(url, ids)
    # Row i names the top-K of position start + i in reverse order, a -1 pad and the real next token.
    rows = []
    for i in range(len(ids) - 1 - start):
        entry = full[start + i + 1]
        ranked = sorted((v["rank"], int(k)) for k, v in entry.items() if v["rank"] is not None and v["rank"] <= K)
        rows.append([t for _, t in reversed(ranked)] + [-1, ids[start + i + 1]])
    body = {"prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprob_token_ids": rows,
            "prompt_logprob_start": start}
    reply = post(url, COMPLETIONS, body)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert "prompt_logprobs" not in choice  # not asked for: only the named rows come back
    scores = choice["prompt_token_id_logprobs"]
    assert len(scores) == len(rows)
    for i, (row, got) in enumerate(zip(rows, scores)):
        entry = full[start + i + 1]
        want = [-9999.0 if t == -1 else entry[str(t)]["logprob"] for t in row]
        assert got == want, (i, row)  # bitwise: the same logits, the same normaliser


def test_named_scoring_beside_the_prompt_logprobs_and_with_the_prefix_cache(server):
    """Asked twice, the second time over a prompt the prefix cache holds with its records: the
    named rows are scored afresh, and equal the first answer."""
    url = server.url
    ids = _prompt_ids(url) * 3
    rows = [[ids[i + 1], 0] for i in range(len(ids) - 1)]
    body = {"prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0,
            "prompt_logprob_token_ids": rows}
    first, second = (post(url, COMPLETIONS, body).json()["choices"][0] for _ in range(2))
    assert first["prompt_token_id_logprobs"] == second["prompt_token_id_logprobs"]
    own = [first["prompt_logprobs"][i + 1][str(ids[i + 1])]["logprob"] for i in range(len(ids) - 1)]
    assert [row[0] for row in first["prompt_token_id_logprobs"]] == own


def _mass(entry_logprobs: list[float], tail: float) -> float:
    return math.fsum(math.exp(v) for v in entry_logprobs) + math.exp(tail)


# The entries and the tail share one float32 normaliser, summed over the vocabulary in float32:
# their probabilities add up to one within its rounding (about 2e-5 here), not exactly.
MASS = 1e-4


def test_tails_with_their_alternatives_hold_all_the_mass(server):
    url = server.url
    body = {"messages": messages("Name a colour."), "max_tokens": 6, "temperature": 0, "logprobs": True,
            "top_logprobs": 3, "return_tail_logprobs": True}
    content = post(url, "/v1/chat/completions", body).json()["choices"][0]["logprobs"]["content"]
    assert content
    for entry in content:
        mass = _mass([alt["logprob"] for alt in entry["top_logprobs"]], entry["tail_logprob"])
        assert mass == pytest.approx(1, abs=MASS)
    # Not asked for: absent, so an OpenAI-shaped client sees no change.
    plain = post(url, "/v1/chat/completions", {**body, "return_tail_logprobs": False}).json()
    assert all("tail_logprob" not in e for e in plain["choices"][0]["logprobs"]["content"])
    # The same tokens and logprobs either way: the tail is read beside them.
    assert [e["logprob"] for e in plain["choices"][0]["logprobs"]["content"]] == [e["logprob"] for e in content]


def test_echoed_tails_and_a_narrower_top(server):
    """Echo scoring gives a tail per prompt token (null for the first, as its logprob); with one
    alternative shown instead of two, the second joins the tail."""
    url = server.url
    ids = _prompt_ids(url)
    body = {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 2, "return_tail_logprobs": True}
    logprobs = post(url, COMPLETIONS, body).json()["choices"][0]["logprobs"]
    tails, tops = logprobs["tail_logprobs"], logprobs["top_logprobs"]
    assert len(tails) == len(ids) and tails[0] is None and tops[0] is None
    for tail, top in zip(tails[1:], tops[1:]):
        assert _mass(list(top.values()), tail) == pytest.approx(1, abs=MASS)
    narrow = post(url, COMPLETIONS, {**body, "logprobs": 1}).json()["choices"][0]["logprobs"]
    for tail1, tail2, top2 in zip(narrow["tail_logprobs"][1:], tails[1:], tops[1:]):
        second = min(top2.values())
        assert math.exp(tail1) == pytest.approx(math.exp(second) + math.exp(tail2), rel=1e-5)


# A wrong type is the 422 every field's type error is here (server/errors.py); the rest are 400s.
@pytest.mark.parametrize(("fields", "param", "says"), [
    ({"prompt_logprob_token_ids": [[5]]}, "prompt_logprob_token_ids", "rows"),
    ({"prompt_logprob_token_ids": "FILL", "bad": 10**9}, "prompt_logprob_token_ids", "1000000000"),
    ({"prompt_logprob_token_ids": "FILL", "bad": -2}, "prompt_logprob_token_ids", "-2"),
    ({"prompt_logprob_token_ids": [5, 6]}, "prompt_logprob_token_ids", "5"),
    ({"prompt_logprob_token_ids": "FILL", "prompt_logprob_start": 999}, "prompt_logprob_start", "999"),
    ({"prompt_logprob_start": 1}, "prompt_logprob_start", "prompt_logprob_token_ids"),
    ({"prompt_logprob_token_ids": "FILL", "stream": True}, "prompt_logprob_token_ids", "stream"),
    ({"return_tail_logprobs": "yes"}, "return_tail_logprobs", "yes"),
    ({"return_tail_logprobs": True}, "return_tail_logprobs", "'logprobs'"),
])
def test_bad_named_rows_are_a_400_naming_the_field(server, fields, param, says):
    url = server.url
    ids = _prompt_ids(url)
    fields = dict(fields)
    if fields.get("prompt_logprob_token_ids") == "FILL":
        rows = [[ids[i + 1]] for i in range(len(ids) - 1)]
        if "bad" in fields:
            rows[2] = [fields.pop("bad")]
        fields["prompt_logprob_token_ids"] = rows
    reply = post(url, COMPLETIONS, {"prompt": ids, "max_tokens": 1, **fields})
    is_type_error = fields.get("return_tail_logprobs") == "yes" or fields.get("prompt_logprob_token_ids") == [5, 6]
    assert reply.status_code == (422 if is_type_error else 400), reply.text
    error = reply.json()["error"]
    assert error["param"] == param
    assert says in error["message"]
