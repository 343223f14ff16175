"""Shared fixtures: one engine on the real default model for the whole session."""

import pytest


@pytest.fixture(scope="session")
def engine():
    """The default model (SmolLM2-135M-Instruct Q4_1) on CPU, float32, max_batch 16.

    Shared: tests must leave it idle (every request finished or aborted).
    """
    from batchproof.config import EngineConfig
    from batchproof.engine import Engine

    return Engine(EngineConfig(device="cpu"))
