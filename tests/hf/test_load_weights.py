"""POST /v1/load_weights: a checkpoint of the same architecture and shapes replaces the weights
in place. Streams running at the swap finish on the old weights (the same replies as a fresh
server on them), the next requests run on the new ones (the same replies as a fresh server on
those), a checkpoint of other shapes is a 400 that changes nothing; off unless
--allow-weight-updates, and behind the admin API key."""

import json
import threading

import httpx
import pytest

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.hf.checkpoint import checkpoint_sha256
from tests.helpers.http import assert_error, parse_sse
from tests.helpers.live_server import live_server

PROMPTS = ["hello the world", "and then 123 more", "the hell and", "in an and", "hello hello", "the the the",
           "a b c d", "1 2 3 4"]
NUM_TOKENS = 300  # long enough that every stream is still running when the swap is asked for


def engine_on(directory) -> Engine:
    return Engine(EngineConfig(model_path=directory, device="cpu", max_batch=8, num_threads=1))


def body(prompt: str, max_tokens: int, **fields) -> dict:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 2, "ignore_eos": True, **fields}


KEY = "sekrit"  # --allow-weight-updates needs an admin API key
AUTH = {"Authorization": f"Bearer {KEY}"}


def reply(url: str, prompt: str, max_tokens: int = 24) -> tuple[str, list[float]]:
    """(text, token logprobs) of a non-streamed completion."""
    choice = httpx.post(url + "/v1/completions", json=body(prompt, max_tokens), headers=AUTH,
                        timeout=60).json()["choices"][0]
    return choice["text"], choice["logprobs"]["token_logprobs"]


class Stream(threading.Thread):
    """A streamed completion read as it arrives; `started` is set at its first chunk."""

    def __init__(self, url: str, prompt: str) -> None:
        super().__init__(daemon=True)
        self.url, self.prompt, self.started, self.raw = url, prompt, threading.Event(), ""

    def run(self) -> None:
        with httpx.stream("POST", self.url + "/v1/completions", json=body(self.prompt, NUM_TOKENS, stream=True),
                          headers=AUTH, timeout=120) as response:
            for text in response.iter_text():
                self.raw += text
                self.started.set()

    def result(self) -> tuple[str, list[float]]:
        events = parse_sse(self.raw)
        assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1]), self.raw[-300:]
        choices = [e["choices"][0] for e in events[:-1] if e.get("choices")]
        return ("".join(c["text"] for c in choices),
                [lp for c in choices if c.get("logprobs") for lp in c["logprobs"]["token_logprobs"]])


@pytest.fixture(scope="module")
def checkpoints(tiny_checkpoint):
    """A tiny llama, the same with other weights (seed 1: a trainer's next step), and a qwen2."""
    return tiny_checkpoint("llama"), tiny_checkpoint("llama", seed=1), tiny_checkpoint("qwen2")


def test_swap_under_load_then_the_new_weights_serve(checkpoints):
    old, new, other_arch = checkpoints
    with live_server(engine_on(old), allow_weight_updates=True, admin_api_key=KEY) as live:
        before = httpx.get(live.url + "/v1/server_info", headers=AUTH).json()
        streams = [Stream(live.url, prompt) for prompt in PROMPTS]
        for s in streams:
            s.start()
        assert all(s.started.wait(60) for s in streams)
        assert all(s.is_alive() for s in streams)  # all 8 running as the swap is asked for
        swap = httpx.post(live.url + "/v1/load_weights", json={"path": str(new)}, headers=AUTH, timeout=120)
        assert swap.status_code == 200, swap.text
        for s in streams:
            s.join(120)
        during = [s.result() for s in streams]
        after = httpx.get(live.url + "/v1/server_info", headers=AUTH).json()
        assert swap.json()["numerics_id"] == after["numerics_id"] != before["numerics_id"]
        assert after["model_sha256"] == swap.json()["model_sha256"] == checkpoint_sha256(new)
        assert after["model_path"] == str(new)
        next_replies = [reply(live.url, p) for p in PROMPTS[:3]]
        refused = httpx.post(live.url + "/v1/load_weights", json={"path": str(other_arch)}, headers=AUTH,
                             timeout=120)
        assert_error(refused, 400, param="path", mentions=(str(other_arch), "load_weights takes the same"))
        missing = httpx.post(live.url + "/v1/load_weights", json={"path": str(other_arch / "nope")}, headers=AUTH,
                             timeout=120)
        assert_error(missing, 400, param="path", mentions=("not a loadable checkpoint under --weights-root",))
        assert httpx.get(live.url + "/v1/server_info", headers=AUTH).json()["numerics_id"] == after["numerics_id"]
        still = [reply(live.url, p) for p in PROMPTS[:3]]
    with live_server(engine_on(old)) as fresh_old:
        assert during == [reply(fresh_old.url, p, NUM_TOKENS) for p in PROMPTS]  # finished on the old weights
    with live_server(engine_on(new)) as fresh_new:
        expected = [reply(fresh_new.url, p) for p in PROMPTS[:3]]
        assert httpx.get(fresh_new.url + "/v1/server_info").json()["numerics_id"] == after["numerics_id"]
    assert next_replies == expected == still
    assert next_replies != during[:3]


def test_off_unless_allowed_and_behind_the_api_key(checkpoints):
    old, new, _ = checkpoints
    engine = engine_on(old)
    with live_server(engine) as live:
        assert_error(httpx.post(live.url + "/v1/load_weights", json={"path": str(new)}), 403,
                     mentions=("--allow-weight-updates",))
    with live_server(engine, allow_weight_updates=True, admin_api_key="sekrit") as live:
        assert_error(httpx.post(live.url + "/v1/load_weights", json={"path": str(new)}), 401, param="authorization")
        good = {"Authorization": "Bearer sekrit"}
        assert_error(httpx.post(live.url + "/v1/load_weights", json={"path": str(new), "x": 1}, headers=good), 400,
                     param="x")
        done = httpx.post(live.url + "/v1/load_weights", json={"path": str(new)}, headers=good, timeout=120)
        assert done.status_code == 200, done.text
        assert json.loads(done.text)["path"] == str(new)
