"""logprobs_mode raw and processed, prompt_logprobs on both routes, --max-logprobs and the bound
on a reply's logprob entries."""

import math

import httpx
import pytest

from tests.helpers.http import assert_error, chunks, post, stream
from tests.helpers.live_server import live_server

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
PROMPT = "Once upon a time"
NEVER = -9999.0  # a dropped token's logprob on the wire


def _complete(url: str, **fields) -> dict:
    response = post(url, COMPLETIONS, {"prompt": PROMPT, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def test_processed_greedy_is_raw(server) -> None:
    """As vLLM's: a greedy choice's distribution would be a point mass; its logits are reported."""
    fields = {"max_tokens": 6, "temperature": 0, "logprobs": 4}
    raw = _complete(server.url, **fields)["choices"]
    processed = _complete(server.url, logprobs_mode="processed", **fields)["choices"]
    assert processed == raw


def test_processed_is_the_truncated_renormalised_distribution(server) -> None:
    fields = {"max_tokens": 8, "temperature": 0.7, "top_k": 3, "seed": 9, "logprobs": 5}
    raw = _complete(server.url, **fields)["choices"][0]["logprobs"]
    processed = _complete(server.url, logprobs_mode="processed", **fields)["choices"][0]["logprobs"]
    assert processed["tokens"] == raw["tokens"]  # asking for a mode never changes a token
    for chosen, top, raw_top in zip(processed["token_logprobs"], processed["top_logprobs"], raw["top_logprobs"]):
        values = list(top.values())
        assert values[3:] == [NEVER, NEVER]  # outside top_k: no mass
        assert math.fsum(math.exp(v) for v in values[:3]) == pytest.approx(1.0, abs=1e-5)
        assert chosen in values[:3]
        kept = list(raw_top)[:3]
        assert list(top)[:3] == kept  # the same order
        # temperature scales the gaps between logits
        gap = (raw_top[kept[0]] - raw_top[kept[1]]) / 0.7
        assert top[kept[0]] - top[kept[1]] == pytest.approx(gap, abs=1e-4)


def test_processed_prompts_batched_and_streamed_answer_as_alone(server) -> None:
    fields = {"max_tokens": 6, "temperature": 0.9, "top_p": 0.8, "seed": 4, "logprobs": 3,
              "logprobs_mode": "processed"}
    prompts = [PROMPT, "The weather today", "In 1999,"]
    together = _complete(server.url, **{**fields, "prompt": prompts})["choices"]
    for i, prompt in enumerate(prompts):
        alone = _complete(server.url, **{**fields, "prompt": prompt})["choices"][0]
        assert together[i]["logprobs"] == alone["logprobs"] and together[i]["text"] == alone["text"]
    _, _, events = stream(server.url, COMPLETIONS, {**fields, "prompt": prompts[0]})
    streamed = [lp for c in chunks(events) for lp in c["choices"][0]["logprobs"]["token_logprobs"]]
    assert streamed == together[0]["logprobs"]["token_logprobs"]


def test_prompt_logprobs_on_completions_equal_echo_scoring(server) -> None:
    reply = _complete(server.url, max_tokens=1, temperature=0, prompt_logprobs=3, echo=True, logprobs=3)
    choice = reply["choices"][0]
    ids = post(server.url, "/tokenize", {"prompt": PROMPT}).json()["tokens"]
    entries = choice["prompt_logprobs"]
    assert len(entries) == len(ids) and entries[0] is None
    for token_id, entry, echoed, top in zip(ids[1:], entries[1:], choice["logprobs"]["token_logprobs"][1:],
                                            choice["logprobs"]["top_logprobs"][1:]):
        own = entry[str(token_id)]
        assert own["logprob"] == echoed
        ranked = sorted((e["rank"], e["logprob"]) for e in entry.values() if e["rank"] is not None)
        assert [lp for _, lp in ranked[:3]] == list(top.values())
        assert own["rank"] is None or entry[str(token_id)]["logprob"] == ranked[own["rank"] - 1][1]
    plain = _complete(server.url, max_tokens=1, temperature=0, prompt_logprobs=0)["choices"][0]
    assert [e and list(e) for e in plain["prompt_logprobs"]] == [None] + [[str(i)] for i in ids[1:]]


def test_prompt_logprobs_on_chat(server, engine) -> None:
    messages = [{"role": "user", "content": "Hi there"}]
    reply = post(server.url, CHAT, {"messages": messages, "max_tokens": 1, "prompt_logprobs": 1}).json()
    ids = engine.chat_prompt_ids(messages)
    entries = reply["prompt_logprobs"]
    assert len(entries) == len(ids) and entries[0] is None
    scored = _complete(server.url, prompt=ids, max_tokens=0, echo=True, logprobs=1)["choices"][0]["logprobs"]
    assert [e[str(i)]["logprob"] for i, e in zip(ids[1:], entries[1:])] == scored["token_logprobs"][1:]
    assert "prompt_logprobs" not in post(server.url, CHAT, {"messages": messages, "max_tokens": 1}).json()


def test_prompt_logprobs_refused_when_streamed_or_above_the_cap(server) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    assert_error(post(server.url, CHAT, {**body, "prompt_logprobs": 1, "stream": True}), 400,
                 param="prompt_logprobs", mentions=("stream",))
    assert_error(post(server.url, CHAT, {**body, "prompt_logprobs": 21}), 400, param="prompt_logprobs",
                 mentions=("--max-logprobs 20",))
    assert_error(post(server.url, CHAT, {**body, "logprobs_mode": "final"}), 422, param="logprobs_mode")


def test_server_settings_default_mode_cap_and_entry_bound(engine) -> None:
    with live_server(engine, logprobs_mode="processed", max_logprobs=3, max_logprob_entries=200) as live:
        info = httpx.get(live.url + "/v1/server_info").json()["server"]
        assert (info["logprobs_mode"], info["max_logprobs"], info["max_logprob_entries"]) == ("processed", 3, 200)
        fields = {"max_tokens": 4, "temperature": 0.8, "top_k": 2, "seed": 1, "logprobs": 3}
        default = _complete(live.url, **fields)["choices"][0]["logprobs"]
        assert default == _complete(live.url, logprobs_mode="processed", **fields)["choices"][0]["logprobs"]
        assert all(list(top.values())[2] == NEVER for top in default["top_logprobs"])
        assert_error(post(live.url, COMPLETIONS, {"prompt": PROMPT, "max_tokens": 1, "logprobs": 4}), 400,
                     param="logprobs", mentions=("--max-logprobs 3",))
        # 60 tokens x (1 + 3) = 240 entries > 200: refused before it runs, naming the limit
        assert_error(post(live.url, COMPLETIONS, {"prompt": PROMPT, "max_tokens": 60, "logprobs": 3}), 400,
                     mentions=("240", "200", "--max-logprob-entries"))
        assert post(live.url, COMPLETIONS, {"prompt": PROMPT, "max_tokens": 60}).status_code == 200
