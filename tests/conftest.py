"""Shared fixtures: one engine on the real default model for the whole session."""

import pytest


@pytest.fixture(scope="session")
def engine():
    """The default model (SmolLM2-135M-Instruct Q4_1) on CPU, float32, max_batch 16.

    Shared: tests must leave it idle (every request finished or aborted).
    """
    from batchproof.engine.config import EngineConfig
    from batchproof.engine.engine import Engine

    return Engine(EngineConfig(device="cpu"))


@pytest.fixture(scope="module")
def server(engine, tmp_path_factory):
    """A live server (uvicorn on loopback) around the shared engine, with a batch log file."""
    from tests.helpers.live_server import live_server

    log_file = tmp_path_factory.mktemp("server") / "batch.log"
    with live_server(engine, log_file=log_file) as live:
        yield live
