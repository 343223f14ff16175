"""Every abort is a reply (docs/weight-versions.md): a request ended by /abort_requests or by a
pause in abort mode ends with finish_reason "abort" (Responses: `incomplete`, reason "abort") on
chat, completions and Responses, streamed and whole, never a 500. What it had made is in it,
the text a stop string held back included, with one logprob entry per token: the same reply,
bit for bit, as the same request cut by max_tokens at that many tokens. A prompt scored by named
tokens ends the same way. A streaming client that leaves while the engine is paused in keep
mode gives its slot back at once, not at /resume.

The races are made deterministic, not timed: the engine is paused in keep mode (no step runs)
with the request where the test wants it, then the abort comes. The control calls go to the
backend on the server's loop, as the routes make them (the routes' keys are tested elsewhere)."""

import asyncio
import json
import threading

import httpx
import pytest

from tests.helpers.http import ASCII_PROMPT, messages, parse_sse, post, wait_until

CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"
NUM_SPELLED = 64  # tokens of the greedy reply a stop string spells: the abort comes long before
MIN_MADE = 3  # tokens the request has made when the engine is paused and the abort comes
NEVER = "@@never@@"  # ends the stop string: it never matches, so the text it spells is held back


def _control(server, method: str, *args) -> int:
    """backend.pause / resume / abort_requests, run on the server's loop."""
    backend = server.state.backend
    return asyncio.run_coroutine_threadsafe(getattr(backend, method)(*args), backend._loop).result(60)


class InFlight(threading.Thread):
    """One request, its body read as it arrives (streamed or whole)."""

    def __init__(self, url: str, route: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.url, self.route, self.body = url, route, body
        self.status, self.raw = None, ""
        self.start()

    def run(self) -> None:
        with httpx.stream("POST", self.url + self.route, json=self.body, timeout=120) as response:
            self.status = response.status_code
            for text in response.iter_text():
                self.raw += text

    def reply(self) -> tuple[int, str]:
        self.join(120)
        assert not self.is_alive(), "the reply never ended"
        return self.status, self.raw


def _body(route: str, **fields) -> dict:
    """A greedy request with logprobs (top 2) and token ids, on each route's own field names."""
    if route == RESPONSES:
        fields["max_output_tokens"] = fields.pop("max_tokens")
        return {"input": ASCII_PROMPT, "temperature": 0, "ignore_eos": True, "top_logprobs": 2,
                "include": ["message.output_text.logprobs"], **fields}
    common = {"temperature": 0, "ignore_eos": True, "return_token_ids": True, **fields}
    if route == CHAT:
        return {"messages": messages(ASCII_PROMPT), "logprobs": True, "top_logprobs": 2, **common}
    return {"prompt": ASCII_PROMPT, "logprobs": 2, **common}


def _entries(logprobs: dict) -> list:
    """A choice's logprob entries: chat's, or legacy completions' lists taken token by token."""
    if "content" in logprobs:
        return logprobs["content"]
    columns = ("tokens", "token_logprobs", "top_logprobs")
    return [list(entry) for entry in zip(*(logprobs.get(column, []) for column in columns))]


def _read(route: str, raw: str, is_streamed: bool) -> tuple[str, list, list[int] | None, str]:
    """(text, logprob entries, token ids (Responses: None), how it finished) of a reply."""
    if route == RESPONSES:
        if is_streamed:  # the last event carries the final response object
            last = raw.strip().split("\n\n")[-1]
            response = json.loads(last.split("data: ", 1)[1])["response"]
        else:
            response = json.loads(raw)
        (part,) = response["output"][0]["content"]
        finish = (response["incomplete_details"] or {}).get("reason", response["status"])
        return part["text"], part["logprobs"], None, finish
    if not is_streamed:
        events = [{"choices": [dict(c, delta=c.get("message") or {}) for c in json.loads(raw)["choices"]]}]
    else:
        events = parse_sse(raw)
        assert events[-1] == "[DONE]", raw[-300:]
        events = events[:-1]
    text, entries, token_ids, finish = "", [], [], None
    for event in events:
        for choice in event["choices"]:
            text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            entries += _entries(choice.get("logprobs") or {})
            token_ids += choice.get("token_ids") or []
            finish = choice.get("finish_reason") or finish
    return text, entries, token_ids, finish


@pytest.fixture(scope="module")
def spelled(server) -> dict[str, str]:
    """Each route's greedy reply text over NUM_SPELLED tokens (chat's and Responses' prompts are one)."""
    texts = {}
    for route in (CHAT, COMPLETIONS):
        reply = post(server.url, route, _body(route, max_tokens=NUM_SPELLED))
        assert reply.status_code == 200, reply.text
        texts[route] = _read(route, reply.text, is_streamed=False)[0]
    return {**texts, RESPONSES: texts[CHAT]}


def _made(engine) -> int:
    """Tokens made so far by the request running (an ended one may hold its slot until the next step)."""
    return max((len(seq.output_ids) for seq in list(engine.scheduler.running) if seq.finish_reason is None),
               default=0)


@pytest.mark.parametrize("is_streamed", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize(("route", "ender"), [(CHAT, "abort_requests"), (CHAT, "pause"),
                                              (COMPLETIONS, "abort_requests"), (RESPONSES, "abort_requests")])
def test_an_abort_while_text_is_held_back_is_the_reply_so_far(server, engine, spelled, route, ender, is_streamed):
    """The stop string spells the reply to come, so all its text is held back (it may be the
    stop) when the abort comes: the reply still carries every token's text, entry and id."""
    body = _body(route, max_tokens=400, stop=[spelled[route] + NEVER], stream=is_streamed)
    running = InFlight(server.url, route, body)
    try:
        assert wait_until(lambda: _made(engine) >= MIN_MADE, timeout=60, interval=0.002)
        _control(server, "pause", "keep")
        num_made = _made(engine)
        if ender == "abort_requests":
            assert _control(server, "abort_requests", None) == 1
        else:  # keep, then abort: ends what it holds
            assert _control(server, "pause", "abort") == 1
    finally:
        _control(server, "resume")
    status, raw = running.reply()
    assert status == 200, raw[-500:]
    if is_streamed and route != RESPONSES:
        assert '"error"' not in raw, raw[-500:]
    text, entries, token_ids, finish = _read(route, raw, is_streamed)
    assert finish == "abort"
    assert MIN_MADE <= len(entries) == num_made < NUM_SPELLED  # held back when it ended, every token in it
    assert spelled[route].startswith(text) and text
    assert token_ids is None or len(token_ids) == num_made
    # The same request cut by max_tokens at as many tokens: the same reply, bit for bit.
    cut = post(server.url, route, _body(route, max_tokens=num_made, stop=[spelled[route] + NEVER]))
    assert cut.status_code == 200, cut.text
    assert _read(route, cut.text, is_streamed=False)[:3] == (text, entries, token_ids)


@pytest.mark.parametrize("route", [CHAT, COMPLETIONS, RESPONSES])
@pytest.mark.parametrize("is_streamed", [True, False], ids=["streamed", "whole"])
def test_an_abort_of_a_request_held_by_a_pause_is_an_empty_reply(server, route, is_streamed):
    _control(server, "pause", "keep")
    try:
        held = InFlight(server.url, route, _body(route, max_tokens=8, stream=is_streamed))
        assert wait_until(lambda: server.state.backend.num_waiting == 1, timeout=30)
        assert _control(server, "abort_requests", None) == 1
    finally:
        _control(server, "resume")
    status, raw = held.reply()
    assert status == 200, raw[-500:]
    text, entries, token_ids, finish = _read(route, raw, is_streamed)
    assert (text, entries, token_ids or [], finish) == ("", [], [], "abort")


def test_an_abort_during_named_token_scoring_is_a_reply(server):
    """vLLM's prompt_logprob_token_ids (whole only: a stream is refused): aborted before its
    prompt was scored, the reply says so, with no rows (null), not a 500."""
    ids = post(server.url, COMPLETIONS, {"prompt": ASCII_PROMPT, "max_tokens": 1,
                                         "return_token_ids": True}).json()["choices"][0]["prompt_token_ids"]
    body = {"prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 1, "echo": True, "logprobs": 1,
            "prompt_logprob_token_ids": [[ids[i + 1], 0] for i in range(len(ids) - 1)]}
    _control(server, "pause", "keep")
    try:
        held = InFlight(server.url, COMPLETIONS, body)
        assert wait_until(lambda: server.state.backend.num_waiting == 1, timeout=30)
        assert _control(server, "abort_requests", None) == 1
    finally:
        _control(server, "resume")
    status, raw = held.reply()
    assert status == 200, raw
    (choice,) = json.loads(raw)["choices"]
    assert choice["finish_reason"] == "abort"
    assert choice["prompt_token_id_logprobs"] is None and choice["prompt_logprobs"] is None
    # Echoed, the prompt's tokens are in the text and unscored (null), as the first one always is.
    assert choice["logprobs"]["token_logprobs"] == [None] * len(ids)
    # Not aborted, the same request scores every row.
    scored = post(server.url, COMPLETIONS, body).json()["choices"][0]
    assert len(scored["prompt_token_id_logprobs"]) == len(ids) - 1


def test_a_stream_that_leaves_while_paused_frees_its_slot_at_once(server, engine):
    backend = server.state.backend
    body = _body(CHAT, max_tokens=400, stream=True)
    try:
        with httpx.stream("POST", server.url + CHAT, json=body, timeout=60) as response:
            lines = response.iter_lines()
            while _made(engine) < MIN_MADE:
                next(lines)
            _control(server, "pause", "keep")
            assert backend.num_running == 1
            # One that arrives while paused and leaves too (held, never in the engine).
            with httpx.stream("POST", server.url + CHAT, json=body, timeout=60) as held:
                assert held.status_code == 200, held.read()
                held_lines = held.iter_lines()  # kept: an iterator dropped closes the connection
                first = next(held_lines)
                assert '"role":"assistant"' in first, first  # the role chunk: admitted and held
                assert backend.num_waiting == 1
        # Both gone while still paused: the slot comes back now, not at /resume.
        assert wait_until(lambda: backend.num_running == 0 and backend.num_waiting == 0
                          and backend.num_free_slots == engine.config.max_batch, timeout=10), \
            "the request kept its slot after its client left"
        assert backend.is_paused
    finally:
        _control(server, "resume")
    reply = post(server.url, CHAT, _body(CHAT, max_tokens=2)).json()  # and the engine goes on
    assert reply["choices"][0]["finish_reason"] == "length"
