"""What a weight swap must not carry over (issue 37: a hand-made bug in each once survived the
suite): the prefix cache's keys and values (stale KV is the bug RL trainers report most), the
old weights for a request that arrives while the swap drains, and the old id for a checkpoint
whose config.json alone changed."""

import json
import shutil
import threading
from pathlib import Path

import httpx
import pytest

from batchproof.engine.inbox import Add, Swap
from batchproof.engine.model.hf.checkpoint import checkpoint_sha256
from batchproof.engine.model.ops import kernels
from tests.helpers.http import wait_until
from tests.helpers.live_server import live_server
from tests.hf.test_load_weights import AUTH, KEY, Stream, engine_on, reply

# Longer than one 16-token block of the prefix cache on the tiny checkpoints' vocabulary.
LONG_PROMPT = "hello the world and then 123 more " * 4
HANG_GUARD_S = 120


@pytest.fixture(scope="module")
def checkpoints(tiny_checkpoint) -> tuple[Path, Path]:
    """A tiny llama and the same with other weights (seed 1: a trainer's next step)."""
    return tiny_checkpoint("llama"), tiny_checkpoint("llama", seed=1)


def _swap(url: str, path: Path) -> dict:
    swap = httpx.post(url + "/v1/load_weights", json={"path": str(path)}, headers=AUTH, timeout=HANG_GUARD_S)
    assert swap.status_code == 200, swap.text
    return swap.json()


def _completion(url: str, prompt: str, max_tokens: int = 8) -> tuple[int, str, list[float]]:
    """(cached prompt tokens, text, token logprobs) of a greedy completion."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 2, "ignore_eos": True}
    answer = httpx.post(url + "/v1/completions", json=body, headers=AUTH, timeout=HANG_GUARD_S).json()
    choice = answer["choices"][0]
    cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    return cached, choice["text"], choice["logprobs"]["token_logprobs"]


def _server(directory: Path, weights_root: Path):
    return live_server(engine_on(directory), allow_weight_updates=True, admin_api_key=KEY, weights_root=weights_root)


@pytest.mark.skipif(not kernels.available(), reason="the prefix cache needs our kernels")
def test_the_prefix_cache_is_emptied_by_a_swap(checkpoints) -> None:
    old, new = checkpoints
    with _server(old, old.parent) as live:
        assert _completion(live.url, LONG_PROMPT)[0] == 0
        assert _completion(live.url, LONG_PROMPT)[0] > 0  # the cache holds the prompt's blocks
        _swap(live.url, new)
        after = _completion(live.url, LONG_PROMPT)
    with live_server(engine_on(new)) as fresh_new:
        expected = _completion(fresh_new.url, LONG_PROMPT)
    assert after == expected and after[0] == 0  # nothing cached from the old weights; their bits


def _queued(backend, kind: type) -> bool:
    with backend._inbox.mutex:
        return any(isinstance(command, kind) for command in backend._inbox.queue)


def test_a_request_arriving_while_the_swap_drains_runs_on_the_new_weights(checkpoints, monkeypatch) -> None:
    """The order is forced, not timed: once the running stream has its first token, the engine
    steps no further until a request is queued behind the swap, so the stream is still running
    when both arrive."""
    old, new = checkpoints
    with _server(old, old.parent) as live:
        backend = live.state.backend
        engine, followed = backend.engine, threading.Event()
        step = engine.step

        def step_until_a_request_follows_the_swap():
            if not followed.is_set() and any(seq.output_ids for seq in engine.scheduler.running):
                assert wait_until(lambda: _queued(backend, Add), timeout=HANG_GUARD_S)
                followed.set()
            return step()

        monkeypatch.setattr(engine, "step", step_until_a_request_follows_the_swap)
        running = Stream(live.url, "hello the world")
        running.start()
        assert wait_until(lambda: backend.num_running == 1, timeout=HANG_GUARD_S)
        swapped: list[dict] = []
        swapping = threading.Thread(target=lambda: swapped.append(_swap(live.url, new)), daemon=True)
        swapping.start()
        assert wait_until(lambda: _queued(backend, Swap), timeout=HANG_GUARD_S)
        assert backend.num_running == 1  # the stream has not ended
        held = reply(live.url, "the hell and")  # queued behind the swap: held until the stream ends
        swapping.join(HANG_GUARD_S)
        running.join(HANG_GUARD_S)
        assert swapped, "load_weights did not answer"
        assert running.result()[0]  # the stream ran to its end
    with live_server(engine_on(new)) as fresh_new:
        assert held == reply(fresh_new.url, "the hell and")
    with live_server(engine_on(old)) as fresh_old:
        assert held != reply(fresh_old.url, "the hell and")


def test_a_checkpoint_that_differs_only_in_config_json_gets_a_new_id(checkpoints) -> None:
    old, _ = checkpoints
    changed = old.parent / f"{old.name}-config-changed"  # beside it, under the same weights root
    shutil.copytree(old, changed, dirs_exist_ok=True)
    config = json.loads((changed / "config.json").read_text())
    config["rope_theta"] = config.get("rope_theta", 10000.0) * 2  # other numerics, the same shapes
    (changed / "config.json").write_text(json.dumps(config))
    with _server(old, old.parent) as live:
        before = httpx.get(live.url + "/v1/server_info", headers=AUTH).json()
        swap = _swap(live.url, changed)
        assert swap["model_sha256"] != before["model_sha256"]
        assert swap["numerics_id"] != before["numerics_id"]
        back = _swap(live.url, old)  # the same files again: the same id as at the start
        assert (back["model_sha256"], back["numerics_id"]) == (before["model_sha256"], before["numerics_id"])
    assert checkpoint_sha256(changed) == swap["model_sha256"] != checkpoint_sha256(old)
