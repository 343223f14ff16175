"""The trainer's routes run through `Backend.control` (engine_client.py's WeightControl): a backend
without one (a fleet's router) gets a 501 in OpenAI's envelope on every one of them, before a
body is read; a backend with one has its calls made there. No model is loaded: the backend is a
stand-in, started as a fleet's router is (create_app's `start`)."""

import time
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient

from batchproof.engine.config import EngineConfig
from batchproof.engine.model.default_model import default_model_path
from batchproof.engine.model.front import ModelFront
from batchproof.server.app import create_app
from batchproof.server.config import ServerConfig
from batchproof.server.engine_client import Backend, WeightControl
from batchproof.server.trainer.verify_rollouts import _weights_now
from tests.helpers.http import assert_error

KEY = "control-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
ENGINE_INFO = {"model_sha256": "ab" * 32, "weights": "f32", "dtype": "f32", "numerics": "test", "model_path": "/m"}
# Every route that needs a WeightControl: (method, path, a body that would be a 400 if it were read).
CONTROL_ROUTES = [
    ("GET", "/weight_info", None),
    ("GET", "/is_paused", None),
    ("POST", "/pause?mode=keep", None),
    ("POST", "/resume", None),
    ("POST", "/abort_requests", b'{"frobnicate": 1}'),
    ("POST", "/v1/load_weights", b'{"frobnicate": 1}'),
]


@cache
def default_front() -> ModelFront:
    """The default model's tokenizer, chat format and context, read from its header (no weights)."""
    return ModelFront.read(default_model_path(), EngineConfig())


class Client:
    """The model's facts, as a route reads them (EngineClient)."""

    prefix_cache = None
    weight_version = "v0"

    def __init__(self) -> None:
        self.front = default_front()

    def chat_prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        raise AssertionError("no route here renders a chat")

    def info(self) -> dict:
        return dict(ENGINE_INFO)


class Control:
    """A WeightControl that records its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.pause_mode = None

    @property
    def is_paused(self) -> bool:
        return self.pause_mode is not None

    async def load_weights(self, path: Path, version: str | None = None, keep: bool = False):
        raise AssertionError("not called here")

    async def pause(self, mode) -> int:
        self.calls.append(("pause", mode))
        self.pause_mode = mode
        return 2

    async def resume(self) -> int:
        self.calls.append(("resume",))
        self.pause_mode = None
        return 1

    async def abort_requests(self, request_ids: list[str] | None) -> int:
        self.calls.append(("abort_requests", request_ids))
        return 0

    def weight_info(self) -> dict:
        return {"weight_version": "v0", "model_sha256": ENGINE_INFO["model_sha256"], "model_path": "/m",
                "loaded_at": 0.0, "is_paused": self.is_paused, "pause_mode": self.pause_mode}


class StandIn:
    """A Backend that runs nothing: `control` is the WeightControl given (None: a fleet's router)."""

    failure = None
    num_faults = 0
    last_fault = None
    num_waiting = num_running = num_free_slots = 0

    def __init__(self, control: WeightControl | None) -> None:
        self.engine = Client()
        self.control = control

    async def open(self, request_id, prompt_ids, params):
        raise AssertionError("no request runs here")

    def stop(self) -> None:
        pass


def _serve(backend: Backend) -> TestClient:
    config = ServerConfig(admin_api_key=KEY, allow_weight_updates=True)
    return TestClient(create_app(config, EngineConfig(), start=lambda state, loop: backend))


def _ready(client: TestClient) -> None:
    deadline = time.monotonic() + 30
    while client.app.state.server.backend is None:
        assert time.monotonic() < deadline, "the stand-in backend never started"
        time.sleep(0.01)


@pytest.mark.parametrize(("method", "path", "body"), CONTROL_ROUTES)
def test_a_backend_without_control_is_a_501_on_every_control_route(method, path, body) -> None:
    with _serve(StandIn(control=None)) as client:
        _ready(client)
        response = client.request(method, path, content=body, headers={**AUTH, "content-type": "application/json"})
        route = path.split("?")[0]
        what = "load_weights" if route == "/v1/load_weights" else route
        error = assert_error(response, 501, param=None, mentions=(f"{what} runs on a single engine",))
        assert error["type"] == "not_implemented_error"


def test_a_backend_with_control_has_its_calls_made_there() -> None:
    control = Control()
    with _serve(StandIn(control=control)) as client:
        _ready(client)
        assert client.post("/pause?mode=keep", headers=AUTH).json() == {"status": "paused", "mode": "keep",
                                                                         "num_aborted": 2}
        assert client.get("/is_paused", headers=AUTH).json() == {"is_paused": True, "mode": "keep"}
        info = client.get("/weight_info", headers=AUTH).json()
        assert info["weight_version"] == "v0" and info["pause_mode"] == "keep" and len(info["numerics_id"]) == 16
        assert client.post("/resume", headers=AUTH).json() == {"status": "resumed", "num_admitted": 1}
        assert client.post("/abort_requests", headers=AUTH).json() == {"num_aborted": 0}
    assert control.calls == [("pause", "keep"), ("resume",), ("abort_requests", None)]


def test_the_notary_names_no_version_without_control() -> None:
    """/v1/verify_rollouts reads the version through the control; a fleet's has none to read."""
    state = SimpleNamespace(backend=StandIn(control=None), served_model_name="m")
    assert _weights_now(state)["weight_version"] is None
    state.backend = StandIn(control=Control())
    assert _weights_now(state)["weight_version"] == "v0"


def test_a_backend_whose_start_cannot_finish_is_a_load_error_not_a_wait() -> None:
    """What runs after the backend starts (the tokenizer's hash for receipts) failing leaves the
    server answering 503 with a reason, as a failed start does, never waiting for a backend."""
    backend = StandIn(control=None)
    backend.engine.front = SimpleNamespace(model_path=Path("/m.gguf"))  # no tokenizer to hash
    with _serve(backend) as client:
        deadline = time.monotonic() + 30
        while client.app.state.server.load_error is None:
            assert time.monotonic() < deadline and client.app.state.server.backend is None
            time.sleep(0.01)
        assert client.get("/health").status_code == 503
        assert client.app.state.server.backend is None
