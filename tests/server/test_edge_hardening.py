"""The HTTP edge: a body read only when declared JSON (415), a Host allow-list without a key
(DNS rebinding), /health that tells strangers only the status, a 500 that carries no
exception text, /detokenize off the event loop, an engine that stops ending `serve`."""

import threading

import httpx
import pytest

from batchproof.commands.serve import run_app
from batchproof.common.config import ConfigError
from batchproof.common.net import free_port
from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.server import admin
from batchproof.server.app import create_app
from batchproof.server.config import ServerConfig
from batchproof.server.trainer import load_weights
from tests.helpers.http import assert_error, chat_body, post, wait_until
from tests.helpers.live_server import live_server

CHAT = "/v1/chat/completions"
JSON_BODY = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}'
SMALL_ENGINE = {"max_batch": 2, "max_model_len": 256}

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")


# --- Content-Type ---------------------------------------------------------------------------

def test_a_body_not_declared_json_is_a_415_before_it_is_parsed(engine, monkeypatch) -> None:
    parsed = []
    monkeypatch.setattr(admin, "parse_body", lambda *args: parsed.append(args))
    monkeypatch.setattr(load_weights, "parse_body", lambda *args: parsed.append(args))
    with live_server(engine) as live:
        for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {} if content_type is None else {"content-type": content_type}
            for path in (CHAT, "/v1/completions", "/v1/responses", "/tokenize", "/detokenize", "/v1/load_weights"):
                response = httpx.post(live.url + path, content=JSON_BODY, headers=headers, timeout=30)
                assert_error(response, 415, param="content-type", code="unsupported_media_type",
                             mentions=("application/json",))
        assert parsed == []
        # Parameters (a charset) and the type's case do not matter.
        response = post(live.url, CHAT, JSON_BODY, headers={"Content-Type": "Application/JSON; charset=utf-8"})
        assert response.status_code == 200, response.text


# --- Host -----------------------------------------------------------------------------------

def test_without_a_key_only_loopback_names_are_served(engine) -> None:
    with live_server(engine) as live:
        port = live.url.rsplit(":", 1)[1]
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", "[::1]", "LOCALHOST"):
            assert post(live.url, CHAT, chat_body("hi", max_tokens=1), headers={"Host": host}).status_code == 200
        for host in (f"attacker.example:{port}", "attacker.example", "127.0.0.1.attacker.example"):
            assert_error(post(live.url, CHAT, chat_body("hi", max_tokens=1), headers={"Host": host}), 403,
                         param="host", code="host_not_allowed", mentions=("--allowed-hosts",))
        assert_error(httpx.get(live.url + "/v1/models", headers={"Host": "attacker.example"}), 403, param="host")
        # Probes and scrapers address a server by its IP: the open paths stay open.
        assert httpx.get(live.url + "/health", headers={"Host": "10.0.0.7:8080"}).json() == {"status": "ok"}


def test_allowed_hosts_extends_the_list_and_a_key_turns_the_check_off(engine) -> None:
    with live_server(engine, allowed_hosts="llm.internal, gpu-box") as live:
        for host, status in (("llm.internal:8080", 200), ("gpu-box", 200), ("other.internal", 403)):
            reply = post(live.url, CHAT, chat_body("hi", max_tokens=1), headers={"Host": host})
            assert reply.status_code == status, (host, reply.text)
    with live_server(engine, api_key="k") as live:
        reply = post(live.url, CHAT, chat_body("hi", max_tokens=1),
                     headers={"Host": "attacker.example", "Authorization": "Bearer k"})
        assert reply.status_code == 200, reply.text


# --- /health and 500s -----------------------------------------------------------------------

def test_health_tells_the_fault_to_a_key_holder_only(engine, monkeypatch) -> None:
    original = Engine._forward
    armed = [True]

    def forward(self, scheduled):
        if armed[0] and any("FAULT" in self.tokenizer.decode(s.prompt_ids) for s in scheduled.prefill):
            armed[0] = False
            raise RuntimeError("injected fault in /srv/secret/path")
        return original(self, scheduled)

    monkeypatch.setattr(Engine, "_forward", forward)
    with live_server(engine, api_key="k") as live:
        key = {"Authorization": "Bearer k"}
        assert post(live.url, CHAT, chat_body("FAULT", max_tokens=2), headers=key).status_code == 500
        assert wait_until(lambda: not engine.has_work(), timeout=10)
        stranger = httpx.get(live.url + "/health")
        assert stranger.status_code == 200 and stranger.json() == {"status": "degraded"}
        holder = httpx.get(live.url + "/health", headers=key).json()
        assert holder["status"] == "degraded" and holder["faults"] == 1
        assert "secret" in holder["last_fault"]


def test_an_unexpected_exception_is_a_500_without_its_text(engine, monkeypatch, capfd) -> None:
    def broken(*args):
        raise RuntimeError("cannot open /srv/secret/tokenizer.json")

    monkeypatch.setattr(admin, "tokenizer_facts", broken)
    with live_server(engine) as live:
        error = assert_error(httpx.get(live.url + "/tokenizer_info"), 500, mentions=("internal error",))
        assert "secret" not in error["message"] and "RuntimeError" not in error["message"]
        error_id = error["message"].split("id ", 1)[1].split(":", 1)[0]
        logged = capfd.readouterr().err
        assert f"internal error {error_id}" in logged and "/srv/secret/tokenizer.json" in logged


# --- /detokenize ----------------------------------------------------------------------------

def test_health_answers_while_detokenize_decodes(engine, monkeypatch) -> None:
    """decode() is held until /health has answered: on the event loop, /health could not."""
    started, release = threading.Event(), threading.Event()
    decode = engine.tokenizer.decode

    def slow_decode(ids, *args, **kwargs):
        if ids == [1, 2, 3]:
            started.set()
            release.wait(30)
        return decode(ids, *args, **kwargs)

    with live_server(engine) as live:
        monkeypatch.setattr(engine.tokenizer, "decode", slow_decode)
        held = threading.Thread(target=post, args=(live.url, "/detokenize", {"tokens": [1, 2, 3]}))
        held.start()
        try:
            assert started.wait(30)
            assert httpx.get(live.url + "/health", timeout=5).json() == {"status": "ok"}  # a hang guard only
        finally:
            release.set()
            held.join(30)


# --- an engine that stops -------------------------------------------------------------------

def _fail_every_step(doomed: Engine, monkeypatch) -> None:
    """Every step of `doomed` raises: after MAX_CONSECUTIVE_FAULTS its engine stops for good."""
    original = Engine.step

    def step(self):
        if self is doomed:
            raise RuntimeError("injected engine failure")
        return original(self)

    monkeypatch.setattr(Engine, "step", step)


def test_an_engine_that_stops_calls_on_engine_failure(monkeypatch) -> None:
    with live_server(None, engine_settings=SMALL_ENGINE) as live:
        stopped = threading.Event()
        live.state.on_engine_failure = stopped.set
        _fail_every_step(live.state.backend.engine, monkeypatch)
        post(live.url, CHAT, chat_body("hi", max_tokens=2), timeout=20)
        assert stopped.wait(20)
        assert httpx.get(live.url + "/health").json() == {"status": "failed"}


def test_serve_exits_non_zero_when_the_engine_stops(monkeypatch, capfd) -> None:
    """run_app, as `batchproof serve` runs it: the engine stops after its faults in a row, the
    server shuts down, and the exit code is 1 (a supervisor restarts it)."""
    config = ServerConfig(host="127.0.0.1", port=free_port())
    app = create_app(config, EngineConfig(device="cpu", **SMALL_ENGINE))
    state = app.state.server

    def fail_steps() -> None:
        assert wait_until(lambda: state.backend is not None, timeout=60)
        _fail_every_step(state.backend.engine, monkeypatch)
        post(f"http://127.0.0.1:{config.port}", CHAT, chat_body("hi", max_tokens=2), timeout=20)

    trigger = threading.Thread(target=fail_steps, daemon=True)
    trigger.start()
    # A hang guard: a server that never ends by itself is ended as a load error would (exit 2).
    guard = threading.Timer(120, lambda: state.on_load_error())
    guard.start()
    try:
        assert run_app(app, config, "serve") == 1
    finally:
        guard.cancel()
    trigger.join(10)
    assert "the engine stopped" in capfd.readouterr().err


def test_weight_updates_without_a_key_are_refused_at_start(monkeypatch) -> None:
    monkeypatch.delenv("BATCHPROOF_API_KEY", raising=False)
    monkeypatch.delenv("BATCHPROOF_ADMIN_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="--allow-weight-updates needs an admin API key"):
        create_app(ServerConfig(allow_weight_updates=True), EngineConfig(device="cpu"))
