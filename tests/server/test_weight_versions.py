"""Weight versions and the control plane over HTTP (docs/weight-versions.md): GET /weight_info;
every reply (chat, completions, Responses; whole and streamed) names the version of each token;
POST /pause?mode=abort|wait|keep, /resume, /abort_requests as vLLM's; and the keep-mode swap
mid-generation, whose tokens equal re-scoring under the weights their span names, bit for bit:
greedy and seeded, one stream alone and a batch of 16, streamed and whole, on the default model."""

import json
import shutil
import threading

import gguf
import httpx
import numpy as np
import openai
import pytest

from batchproof.engine.model.known_models import resolve_model
from tests.helpers.http import assert_error, parse_sse, wait_until
from tests.helpers.live_server import live_server

KEY = "versions-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
NUM_TOKENS = 40  # long enough that every request is still running as the swap comes
MODEL = "SmolLM2-135M-Instruct.Q4_1"


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A weights root holding the default model's file and a copy with its output norm scaled
    (the same shapes, other numbers: a trainer's next step)."""
    root = tmp_path_factory.mktemp("weights")
    shutil.copyfile(resolve_model(None), root / "old.gguf")
    shutil.copyfile(root / "old.gguf", root / "new.gguf")
    reader = gguf.GGUFReader(root / "new.gguf", "r+")
    norm = next(t for t in reader.tensors if t.name == "output_norm.weight")
    norm.data[:] = norm.data * np.float32(1.25)
    reader.data.flush()
    return root


@pytest.fixture(scope="module")
def live(engine, weights):
    with live_server(engine, allow_weight_updates=True, admin_api_key=KEY, weights_root=weights) as live:
        yield live
    # The shared engine (idle now: its server stopped) goes back to the default model's file,
    # whatever happened, so the tests after these see the weights and path they expect.
    if engine.model_path != resolve_model(None) or engine.weight_version != engine.model_sha256[:16]:
        engine.install_weights(engine.prepare_weights(resolve_model(None)))


def _post(url: str, path: str, body: dict | None = None, **params) -> httpx.Response:
    return httpx.post(url + path, json=body, params=params, headers=AUTH, timeout=120)


def _load(url: str, path: str, **fields) -> dict:
    reply = _post(url, "/v1/load_weights", {"path": path, **fields})
    assert reply.status_code == 200, reply.text
    return reply.json()


def _body(route: str, text: str, kind: str, seed: int) -> dict:
    sampled = {"temperature": 0.9, "seed": seed} if kind == "seeded" else {"temperature": 0}
    common = {"max_tokens": NUM_TOKENS, "ignore_eos": True, "return_token_ids": True, **sampled}
    if route == CHAT:
        return {"messages": [{"role": "user", "content": text}], "logprobs": True, **common}
    return {"prompt": text, "logprobs": 0, **common}


class Request(threading.Thread):
    """One request read as it arrives (streamed) or whole; `tokens` counts the tokens seen so far."""

    def __init__(self, url: str, route: str, body: dict, streamed: bool) -> None:
        super().__init__(daemon=True)
        self.url, self.route, self.body, self.streamed = url, route, {**body, "stream": streamed}, streamed
        self.raw, self.tokens, self.reply = "", 0, None

    def run(self) -> None:
        if not self.streamed:
            self.reply = httpx.post(self.url + self.route, json=self.body, headers=AUTH, timeout=300).json()
            return
        with httpx.stream("POST", self.url + self.route, json=self.body, headers=AUTH, timeout=300) as response:
            for text in response.iter_text():
                self.raw += text
                complete = self.raw[:self.raw.rfind("\n\n") + 2]
                self.tokens = sum(len(c.get("token_ids", [])) for e in parse_sse(complete) if isinstance(e, dict)
                                  for c in e.get("choices", [])) if complete else 0

    def choices(self) -> list[dict]:
        """Each chunk's choice (streamed) or the one choice (whole)."""
        self.join(300)
        if not self.streamed:
            return self.reply["choices"]
        events = parse_sse(self.raw)
        assert events[-1] == "[DONE]", self.raw[-300:]
        return [c for e in events[:-1] for c in e["choices"]]

    def rollout(self) -> tuple[list[int], list[int], list[float], list[dict], str]:
        """(prompt ids, reply ids, their logprobs, the spans joined, the finish reason)."""
        choices = self.choices()
        if self.streamed:
            prompt_ids = json.loads(self.raw.split("data: ", 2)[1])
            prompt_ids = (prompt_ids.get("prompt_token_ids") or prompt_ids["choices"][0]["prompt_token_ids"])
        else:
            prompt_ids = self.reply.get("prompt_token_ids") or choices[0]["prompt_token_ids"]
        token_ids, logprobs, spans = [], [], []
        for choice in choices:
            if "token_ids" not in choice:
                continue  # chat's role chunk
            token_ids += choice["token_ids"]
            if choice.get("logprobs"):
                logprobs += _logprobs(self.route, choice)
            assert choice["weight_version"]
            spans += choice["weight_version_spans"]
        return prompt_ids, token_ids, logprobs, _joined(spans), choices[-1]["finish_reason"]


def _logprobs(route: str, choice: dict) -> list[float]:
    if route == CHAT:
        return [entry["logprob"] for entry in choice["logprobs"]["content"]]
    return choice["logprobs"]["token_logprobs"]


def _joined(spans: list[dict]) -> list[dict]:
    """A stream's spans end to end (each chunk's begins where the last one's ended), a version's joined."""
    joined: list[dict] = []
    for span in spans:
        assert span["start"] == (joined[-1]["end"] if joined else 0), spans
        if joined and joined[-1]["version"] == span["version"]:
            joined[-1] = {**joined[-1], "end": span["end"]}
        else:
            joined.append(dict(span))
    return joined


def _rescored(url: str, prompt_ids: list[int], token_ids: list[int]) -> list[float]:
    """The reply's tokens scored as one prompt (echo, max_tokens 0) by the weights served now."""
    reply = _post(url, COMPLETIONS, {"prompt": prompt_ids + token_ids, "echo": True, "max_tokens": 0, "logprobs": 0})
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["logprobs"]["token_logprobs"][len(prompt_ids):]


def test_weight_info_names_the_served_file_and_every_reply_its_version(live, engine):
    info = httpx.get(live.url + "/weight_info", headers=AUTH).json()
    assert info["weight_version"] == engine.model_sha256[:16] and info["model_sha256"] == engine.model_sha256
    server_info = httpx.get(live.url + "/v1/server_info", headers=AUTH).json()
    assert info["numerics_id"] == server_info["numerics_id"] and info["is_paused"] is False
    version = info["weight_version"]
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=KEY)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                          temperature=0, extra_body={"return_token_ids": True})
    choice = chat.choices[0].model_extra
    assert choice["weight_version"] == version
    assert choice["weight_version_spans"] == [{"start": 0, "end": len(choice["token_ids"]), "version": version}]
    text = client.completions.create(model=MODEL, prompt="The sea", max_tokens=5, temperature=0, stream=True)
    spans = [s for chunk in text for c in chunk.choices for s in c.model_extra["weight_version_spans"]]
    assert _joined([dict(s) for s in spans]) == [{"start": 0, "end": 5, "version": version}]
    response = client.responses.create(model=MODEL, input="Hi", max_output_tokens=6, temperature=0)
    assert response.model_extra["weight_version"] == version
    assert response.model_extra["weight_version_spans"][-1]["version"] == version
    events = list(client.responses.create(model=MODEL, input="Hi", max_output_tokens=6, temperature=0, stream=True))
    assert events[-1].response.model_extra["weight_version_spans"] == response.model_extra["weight_version_spans"]


def test_control_routes_check_their_input_and_their_key(live, engine):
    assert_error(_post(live.url, "/pause", mode="later"), 400, param="mode", mentions=("'later'", "keep"))
    assert_error(httpx.post(live.url + "/pause"), 401, param="authorization")
    assert_error(_post(live.url, "/abort_requests", {"request_ids": "x"}), 422, param="request_ids")
    assert_error(_post(live.url, "/v1/load_weights", {"path": "new.gguf", "mode": "now"}), 422, param="mode")
    assert_error(_post(live.url, "/v1/load_weights", {"path": "new.gguf", "weight_version": ""}), 422,
                 param="weight_version")
    with live_server(engine, api_key=KEY) as closed:  # without --allow-weight-updates
        for path in ("/pause", "/resume", "/abort_requests"):
            assert_error(_post(closed.url, path), 403, mentions=("--allow-weight-updates",))
        assert httpx.get(closed.url + "/is_paused", headers=AUTH).json() == {"is_paused": False, "mode": None}


def test_pause_abort_then_held_until_resume_and_abort_requests(live):
    long = {**_body(COMPLETIONS, "The sea at night", "greedy", 0), "max_tokens": 1000}  # running as the pause comes
    running = Request(live.url, COMPLETIONS, long, streamed=True)
    running.start()
    assert wait_until(lambda: running.tokens >= 2, timeout=60)
    paused = _post(live.url, "/pause", mode="abort").json()
    assert paused == {"status": "paused", "mode": "abort", "num_aborted": 1}
    assert running.rollout()[-1] == "abort"
    assert httpx.get(live.url + "/is_paused", headers=AUTH).json() == {"is_paused": True, "mode": "abort"}
    held = [Request(live.url, CHAT, _body(CHAT, "Hello", "greedy", 0), streamed=True) for _ in range(2)]
    for request in held:
        request.start()
    assert wait_until(lambda: all(r.raw for r in held), timeout=30)  # the role chunks: admitted, held
    first_id = json.loads(held[0].raw.split("data: ", 2)[1])["id"]
    assert _post(live.url, "/abort_requests", {"request_ids": [first_id]}).json() == {"num_aborted": 1}
    assert held[0].rollout()[-1] == "abort" and held[0].rollout()[1] == []
    assert held[1].is_alive()  # still held: a paused engine admits nobody
    assert _post(live.url, "/resume").json() == {"status": "resumed", "num_admitted": 1}
    assert held[1].rollout()[-1] == "length"
    assert _post(live.url, "/abort_requests").json() == {"num_aborted": 0}


def test_pause_wait_lets_running_requests_finish(live):
    running = Request(live.url, COMPLETIONS, _body(COMPLETIONS, "The sea at night", "greedy", 0), streamed=True)
    running.start()
    assert wait_until(lambda: running.tokens >= 2, timeout=60)
    assert _post(live.url, "/pause", mode="wait").json()["num_aborted"] == 0  # answered once it finished
    _, token_ids, _, _, finish_reason = running.rollout()
    assert finish_reason == "length" and len(token_ids) == NUM_TOKENS
    assert _post(live.url, "/resume").json()["status"] == "resumed"


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
@pytest.mark.parametrize("batch", [1, 16])
def test_keep_swap_mid_generation_matches_rescoring_on_each_side(live, engine, weights, monkeypatch, kind, batch):
    """c=1: /pause?mode=keep, load_weights, /resume; a batch: load_weights with mode keep (no
    pause; the new weights read beforehand, so the swap lands while every request runs). Half
    the batch streamed, half whole; chat and completions."""
    if batch > 1:
        prepared = engine.prepare_weights(weights / "new.gguf")
        monkeypatch.setattr(engine, "prepare_weights", lambda path: prepared)
    old_version = httpx.get(live.url + "/weight_info", headers=AUTH).json()["weight_version"]
    routes = [(COMPLETIONS, CHAT)[i % 2] for i in range(batch)]
    requests = [Request(live.url, route, _body(route, f"Tell me about the sea, part {i}", kind, 7 + i),
                        streamed=i % 2 == 0) for i, route in enumerate(routes)]
    for request in requests:
        request.start()
    assert wait_until(lambda: requests[0].tokens >= 3, timeout=120)
    if batch == 1:
        assert _post(live.url, "/pause", mode="keep").json()["num_aborted"] == 0
        swap = _load(live.url, "new.gguf", weight_version="step-2")
        assert httpx.get(live.url + "/is_paused", headers=AUTH).json()["is_paused"] is True
        assert _post(live.url, "/resume").json()["status"] == "resumed"
    else:
        swap = _load(live.url, "new.gguf", weight_version="step-2", mode="keep")
        monkeypatch.undo()  # load_weights reads its files again
    assert swap["mode"] == "keep" and swap["weight_version"] == "step-2" and swap["num_refilled"] >= 1
    rollouts = [request.rollout() for request in requests]
    assert httpx.get(live.url + "/weight_info", headers=AUTH).json()["weight_version"] == "step-2"
    cuts = []
    for _prompt_ids, token_ids, logprobs, spans, finish_reason in rollouts:
        assert finish_reason == "length" and len(token_ids) == len(logprobs) == NUM_TOKENS
        cut = spans[0]["end"] if spans[0]["version"] == old_version else 0
        assert spans == [s for s in ({"start": 0, "end": cut, "version": old_version},
                                     {"start": cut, "end": NUM_TOKENS, "version": "step-2"}) if s["start"] < s["end"]]
        cuts.append(cut)
    assert 0 < cuts[0] < NUM_TOKENS  # the first request was cut by the swap
    under_new = [_rescored(live.url, p, t) for p, t, *_ in rollouts]
    _load(live.url, "old.gguf")  # back to the old weights (idle: a drain swap), to re-score under them
    under_old = [_rescored(live.url, p, t) for p, t, *_ in rollouts]
    for (_, _, logprobs, _, _), cut, new, old in zip(rollouts, cuts, under_new, under_old, strict=True):
        assert logprobs[:cut] == old[:cut]
        assert logprobs[cut:] == new[cut:]
        # The swap changed the numbers, where the reply has tokens after it: in a batch of 16 a
        # request admitted early may finish (drafts accepted) before the swap lands.
        assert cut == NUM_TOKENS or old[cut:] != new[cut:]
