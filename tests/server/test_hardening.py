"""What one caller can do to the others: a bias over the whole vocabulary, a body of megabytes,
a prompt that cannot fit, a template that raises, a step that faults, a burst past the queue,
and reading another caller's prompts from `cached_tokens`. Each server is its own, around the
shared engine."""

import asyncio
import dataclasses
import json
import threading

import httpx
import pytest

from batchproof.engine.async_engine import AsyncEngine
from batchproof.engine.engine import Engine
from batchproof.engine.model.ops import kernels
from batchproof.engine.sampling.params import SamplingParams
from batchproof.engine.text.chat_template import ChatTemplate
from batchproof.server.serving import admit
from tests.helpers.http import assert_error, chat_body, parse_sse, post, wait_until
from tests.helpers.live_server import live_server

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


# --- logit_bias -----------------------------------------------------------------------------

def test_logit_bias_is_capped_and_a_full_vocabulary_bias_runs_with_the_same_bits(engine) -> None:
    vocab = engine.tokenizer.vocab_size
    with live_server(engine, max_logit_bias=vocab) as big, live_server(engine) as default:
        over = {str(i): 0.0 for i in range(1025)}
        assert_error(post(default.url, CHAT, chat_body("hi", max_tokens=1, logit_bias=over)), 400,
                     param="logit_bias", mentions=("1025", "1024", "--max-logit-bias"))
        # A bias of 0.0 on every token changes no bit; -100 on all but one forces that one.
        plain = post(big.url, CHAT, chat_body("hi", max_tokens=4, logprobs=True)).json()
        zero = post(big.url, CHAT, chat_body("hi", max_tokens=4, logprobs=True,
                                             logit_bias={str(i): 0.0 for i in range(vocab)})).json()
        assert zero["choices"][0]["logprobs"] == plain["choices"][0]["logprobs"]
        forced_id = engine.tokenizer.encode(" yes")[0]
        forced = post(big.url, CHAT, chat_body("hi", max_tokens=2, n=2, logit_bias={
            str(i): (100.0 if i == forced_id else -100.0) for i in range(vocab)})).json()
        assert [c["message"]["content"] for c in forced["choices"]] == [" yes yes"] * 2


# --- bodies and prompts ---------------------------------------------------------------------

def test_a_body_over_the_limit_is_refused_with_413_before_it_is_read(engine) -> None:
    with live_server(engine, max_request_mb=0.01) as live:
        body = json.dumps(chat_body("word " * 4000, max_tokens=1)).encode()
        assert len(body) > 0.01 * 2**20
        assert_error(post(live.url, CHAT, body, headers={"content-type": "application/json"}), 413,
                     code="request_too_large", mentions=("--max-request-mb",))

        def chunked():  # no Content-Length: counted as it arrives
            for start in range(0, len(body), 1000):
                yield body[start:start + 1000]

        assert_error(httpx.post(live.url + CHAT, content=chunked(), timeout=30,
                                headers={"content-type": "application/json"}), 413, code="request_too_large")
        assert post(live.url, CHAT, chat_body("hi", max_tokens=1)).status_code == 200


def test_a_prompt_that_cannot_fit_is_refused_without_being_tokenized(engine, monkeypatch) -> None:
    context = engine.max_model_len
    too_long = "x" * (context * engine.tokenizer.max_token_text_bytes + 1)
    with live_server(engine, max_request_mb=64) as live:
        def refuse(*args, **kwargs):
            raise AssertionError("a prompt that cannot fit was tokenized")

        monkeypatch.setattr(engine.tokenizer, "encode", refuse)
        assert_error(post(live.url, CHAT, chat_body(too_long, max_tokens=1)), 400, param="messages",
                     mentions=("too long",))
        assert_error(post(live.url, COMPLETIONS, {"prompt": [too_long, "hi"], "max_tokens": 1}), 400,
                     param="prompt", mentions=("'prompt[0]'",))
        assert_error(post(live.url, "/tokenize", {"prompt": "x" * (2**20 + 1)}), 400, param="prompt")
        assert_error(post(live.url, "/detokenize", {"tokens": [1] * (16 * context + 1)}), 400, param="tokens")


def test_health_answers_while_a_request_is_being_tokenized(engine, monkeypatch) -> None:
    """Parsing, rendering and tokenizing run on a worker thread: the event loop (and /health,
    and every other stream) goes on meanwhile. The tokenizer is held inside encode() here
    until /health has answered; on the event loop, /health could not answer at all."""
    started, release = threading.Event(), threading.Event()
    encode = engine.tokenizer.encode

    def slow_encode(text, add_bos=False):
        if "HOLD" in text:
            started.set()
            release.wait(60)
        return encode(text, add_bos)

    with live_server(engine) as live:
        monkeypatch.setattr(engine.tokenizer, "encode", slow_encode)
        held = threading.Thread(target=post, args=(live.url, COMPLETIONS, {"prompt": "HOLD", "max_tokens": 1}))
        held.start()
        try:
            assert started.wait(30)
            assert httpx.get(live.url + "/health", timeout=10).json() == {"status": "ok"}
        finally:
            release.set()
            held.join(60)


# --- templates ------------------------------------------------------------------------------

def test_a_template_that_raises_is_a_400_naming_messages(engine, monkeypatch) -> None:
    strict = ChatTemplate("{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role here') }}"
                          "{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}", "", "")
    monkeypatch.setattr(engine, "front", dataclasses.replace(engine.front, chat_template=strict))
    with live_server(engine) as live:
        body = {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}], "max_tokens": 1}
        assert_error(post(live.url, CHAT, body), 400, param="messages", mentions=("no system role here",))
        assert_error(post(live.url, "/tokenize", {"messages": body["messages"]}), 400, param="messages")
        assert post(live.url, CHAT, chat_body("hi", max_tokens=1)).status_code == 200


# --- faults ---------------------------------------------------------------------------------

@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_a_faulting_step_fails_only_its_requests_and_the_server_goes_on(engine, monkeypatch, streamed) -> None:
    original = Engine._forward
    armed = [True]

    def forward(self, scheduled):
        if armed[0] and any("FAULT" in self.tokenizer.decode(s.prompt_ids) for s in scheduled.prefill):
            armed[0] = False
            raise RuntimeError("injected fault")
        return original(self, scheduled)

    monkeypatch.setattr(Engine, "_forward", forward)
    with live_server(engine) as live:
        body = chat_body("FAULT", max_tokens=3, logprobs=True)
        if streamed:
            response = post(live.url, CHAT, {**body, "stream": True})
            events = parse_sse(response.text)
            message = events[-1]["error"]["message"]
            assert "[DONE]" not in events
        else:
            message = assert_error(post(live.url, CHAT, body), 500, mentions=("fault",))["message"]
        # The fault's id, never its text (which can name files): the log has the text under the id.
        assert "engine step failed (fault " in message and "injected" not in message
        backend = live.state.backend
        # The faulted sequence gives its slot back at the next step (the engine steps until it has).
        assert wait_until(lambda: engine.num_free_slots == engine.config.max_batch, timeout=10)
        reply = post(live.url, CHAT, chat_body("hi", max_tokens=2, logprobs=True))
        assert reply.status_code == 200 and len(reply.json()["choices"][0]["logprobs"]["content"]) == 2
        health = httpx.get(live.url + "/health")
        assert health.status_code == 200
        assert health.json() == {"status": "degraded"}  # what went wrong: only to a key holder
        assert backend.failure is None


# --- admission ------------------------------------------------------------------------------

def test_admission_counts_requests_opened_but_not_yet_read(engine) -> None:
    """Simultaneous arrivals: each is admitted, then opened, before any reply reads its deltas.
    The queue depth must count it from the moment it is opened, or --max-queue overshoots."""
    backend = AsyncEngine(engine, 0.0)  # never started: nothing leaves the queue

    async def arrivals() -> list[int]:
        admitted, opened = [], []
        for i in range(5):
            try:
                admit(backend, 3, 1)
            except Exception as e:
                assert getattr(e, "status", None) == 429
                continue
            opened.append(await backend.open(f"burst-{i}", [1, 2, 3], SamplingParams(max_tokens=1)))
            admitted.append(i)
        assert backend.num_waiting == 3
        return admitted

    assert asyncio.run(arrivals()) == [0, 1, 2]


def test_a_request_opened_and_never_read_is_aborted(engine) -> None:
    with live_server(engine) as live:
        backend = live.state.backend

        async def open_and_drop() -> None:
            opened = await backend.open("dropped", [1, 2, 3], SamplingParams(max_tokens=200, ignore_eos=True))
            await opened.outputs.aclose()

        asyncio.run_coroutine_threadsafe(open_and_drop(), backend._loop).result(10)
        assert wait_until(lambda: not engine.has_work(), timeout=30)
        assert engine.num_free_slots == engine.config.max_batch


# --- API keys and the prefix cache's namespaces ---------------------------------------------

def test_api_keys_from_a_file_or_the_environment(engine, tmp_path, monkeypatch) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# tenants\nalpha-key\n\nbeta-key\n")
    with live_server(engine, api_key_file=keys) as live:
        for key, status in (("alpha-key", 200), ("beta-key", 200), ("gamma-key", 401), ("# tenants", 401)):
            reply = post(live.url, CHAT, chat_body("hi", max_tokens=1), headers={"Authorization": f"Bearer {key}"})
            assert reply.status_code == status, (key, reply.text)
    monkeypatch.setenv("BATCHPROOF_API_KEY", "from-env")
    with live_server(engine) as live:
        assert post(live.url, CHAT, chat_body("hi", max_tokens=1)).status_code == 401
        good = post(live.url, CHAT, chat_body("hi", max_tokens=1), headers={"Authorization": "Bearer from-env"})
        assert good.status_code == 200


SECRET_PROMPT = ("The quarterly figures for the Halvorsen account, confidential: revenue up eleven percent, "
                 "the merger with Brightwater set for March, and the layoffs kept from the press. ") * 2


def _cached(url: str, key: str | None = None, **fields) -> tuple[int, list]:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    # The completions route: a chat template's own opening would be a prefix every test shares.
    reply = post(url, COMPLETIONS, {"prompt": SECRET_PROMPT, "max_tokens": 3, "temperature": 0, "logprobs": 2,
                                    **fields}, headers=headers).json()
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"], reply["choices"]


@pytest.mark.skipif(not kernels.available(), reason="the cache needs our kernels")
def test_a_guessed_prefix_from_another_key_or_salt_is_never_a_hit(engine, tmp_path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("tenant-one\ntenant-two\n")
    with live_server(engine, api_key_file=keys) as live:  # scope `key`, the default with keys
        first, choices = _cached(live.url, "tenant-one")
        again, same_key = _cached(live.url, "tenant-one")
        other, other_key = _cached(live.url, "tenant-two")
        assert first == 0 and again > 0 and other == 0
        assert same_key == choices == other_key  # hits or not, the same bits
    with live_server(engine) as live:  # scope `shared`: a cache_salt still sets a request apart
        assert _cached(live.url, cache_salt="tenant-a")[0] == 0
        assert _cached(live.url, cache_salt="tenant-a")[0] > 0
        assert _cached(live.url, cache_salt="tenant-b")[0] == 0
        assert _cached(live.url)[0] == 0
        assert_error(post(live.url, CHAT, chat_body("hi", max_tokens=1, cache_salt="")), 422, param="cache_salt")
    with live_server(engine, prefix_cache_scope="salt") as live:  # no salt: no reuse at all
        assert [_cached(live.url)[0] for _ in range(2)] == [0, 0]
        assert [_cached(live.url, cache_salt="team")[0] for _ in range(2)][1] > 0


# --- the hostile list -----------------------------------------------------------------------

def _hostile_requests(vocab: int, context: int) -> list[tuple[str, bytes]]:
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}

    def body(path: str, **fields) -> tuple[str, bytes]:
        base = chat if path == CHAT else {"prompt": "hi", "max_tokens": 1}
        return path, json.dumps({**base, **fields}).encode()

    return [
        (CHAT, b"[" * 100_000 + b"]" * 100_000),  # nesting past any parser's recursion
        (CHAT, b'{"messages": ' + b"[" * 5_000 + b"]" * 5_000 + b"}"),
        (CHAT, b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 1}'),  # a lone surrogate
        (CHAT, b'{"messages": [{"role": "user", "content": "a\\u0000b"}], "max_tokens": 1}'),
        body(CHAT, messages=[{"role": "user", "content": "hi"}] * 20_000),
        body(CHAT, n=10**9), body(CHAT, max_tokens=10**18), body(CHAT, seed=10**40),
        body(CHAT, stop=["x"] * 10_000), body(CHAT, logprobs=True, top_logprobs=10**6),
        body(CHAT, logit_bias={str(i): 1.0 for i in range(vocab)}),
        body(CHAT, logit_bias={"1" * 5000: 1.0}),
        body(COMPLETIONS, prompt=["hi"] * 100_000),
        body(COMPLETIONS, prompt=[1] * (context + 1)),
        body(COMPLETIONS, prompt=[[1]] * 5_000),
        body(COMPLETIONS, prompt="hi " * (context * 2)),
        body(COMPLETIONS, prompt="hi", echo=True, max_tokens=0, logprobs=10**6),
        ("/detokenize", json.dumps({"tokens": list(range(min(vocab, 100_000)))}).encode()),
        ("/tokenize", json.dumps({"prompt": "hi " * 2**19}).encode()),
        ("/tokenize", json.dumps({"messages": [{"role": "user", "content": "hi"}] * 20_000}).encode()),
    ]


def test_the_hostile_list_gets_clean_answers_and_the_server_stays_whole(engine) -> None:
    with live_server(engine) as live:
        for path, body in _hostile_requests(engine.tokenizer.vocab_size, engine.max_model_len):
            response = httpx.post(live.url + path, content=body, timeout=60,
                                  headers={"content-type": "application/json"})
            assert response.status_code < 500, (path, body[:80], response.text[:300])
            if response.status_code >= 400:
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}
                assert len(response.text) < 2_000, "an error that echoes the request back"
        assert httpx.get(live.url + "/health").json() == {"status": "ok"}
        assert wait_until(lambda: not engine.has_work(), timeout=30)
