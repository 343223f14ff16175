"""Inputs the validation accepts must never kill the engine thread: after any request the
server stays healthy and answers the next one. Each test runs its own server; the ones
whose bug leaves the engine half-stepped load a fresh (small) engine of their own."""

import httpx
import pytest

from batchproof.engine.engine import Engine
from tests.helpers.http import chat_body, post
from tests.helpers.live_server import live_server

CHAT = "/v1/chat/completions"
SMALL_ENGINE = {"max_batch": 2, "max_model_len": 256}

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")


def _still_serving(url: str) -> None:
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    # A dead engine thread leaves requests waiting forever: a short client timeout.
    reply = post(url, CHAT, chat_body("hi", max_tokens=2, logprobs=True), timeout=20)
    assert reply.status_code == 200 and len(reply.json()["choices"][0]["logprobs"]["content"]) == 2


@pytest.mark.parametrize("seed", [2 ** 64, -(2 ** 63) - 1])
def test_a_seed_outside_64_bits_is_refused_and_the_engine_survives(engine, seed) -> None:
    # add_request fails before the engine changes, so the shared engine stays usable.
    with live_server(engine) as live:
        response = post(live.url, CHAT, chat_body("hi", max_tokens=2, seed=seed), timeout=20)
        assert response.status_code in (200, 400, 422), response.text
        if response.status_code != 200:
            assert response.json()["error"]["param"] == "seed"
        _still_serving(live.url)


@pytest.fixture
def server_for_seeds(engine):
    with live_server(engine) as live:
        yield live


def test_every_64_bit_seed_works(server_for_seeds) -> None:
    for seed in (0, 2 ** 63 - 1, 2 ** 64 - 1, -(2 ** 63)):
        reply = post(server_for_seeds.url, CHAT, chat_body("hi", max_tokens=2, temperature=1.0, seed=seed))
        assert reply.status_code == 200, reply.text
    same = [post(server_for_seeds.url, CHAT, chat_body("Tell me a story.", max_tokens=6, temperature=1.0, seed=5))
            .json()["choices"][0]["message"]["content"] for _ in range(2)]
    assert same[0] == same[1]  # a seed makes sampling repeatable


def test_tiny_sampling_values_are_served() -> None:
    """Values just inside float32's range (a fresh engine: a regression here would leave it half-stepped)."""
    with live_server(None, engine_settings=SMALL_ENGINE) as live:
        for fields in ({"temperature": 1e-39}, {"temperature": 1.0, "repetition_penalty": 1e-45},
                       {"temperature": 1.0, "min_p": 1e-46}, {"temperature": 1e-30, "top_p": 1e-40}):
            response = post(live.url, CHAT, {**chat_body("hi", max_tokens=2, logprobs=True), **fields}, timeout=20)
            assert response.status_code == 200, (fields, response.text)
            assert len(response.json()["choices"][0]["logprobs"]["content"]) == 2
        _still_serving(live.url)


@pytest.mark.parametrize("fields", [{"temperature": 1e-300}, {"temperature": 1.0, "top_p": 5e-324}],
                         ids=["temperature", "top-p"])
def test_sampling_values_below_float32_never_kill_the_engine(fields) -> None:
    with live_server(None, engine_settings=SMALL_ENGINE) as live:
        response = post(live.url, CHAT, {**chat_body("hi", max_tokens=3), **fields}, timeout=20)
        assert response.status_code in (200, 400, 422), response.text
        _still_serving(live.url)


def test_requests_after_the_engine_thread_died_are_refused_at_once(monkeypatch) -> None:
    with live_server(None, engine_settings=SMALL_ENGINE) as live:
        doomed = live.state.backend.engine
        original = Engine.step

        def step(self):
            if self is doomed:
                raise RuntimeError("injected engine failure")
            return original(self)

        monkeypatch.setattr(Engine, "step", step)
        error = post(live.url, CHAT, chat_body("hi", max_tokens=2), timeout=20).json()["error"]
        # The engine's end is named, its exception's text is not (the log has it).
        assert "the engine stopped" in error["message"] and "injected" not in error["message"]
        assert httpx.get(live.url + "/health").status_code == 503
        later = post(live.url, CHAT, chat_body("hi", max_tokens=2), timeout=5)
        assert later.status_code == 503
