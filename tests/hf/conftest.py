"""Checkpoint directories shared by the tests here: written once per session (transformers is
imported only when one is first asked for)."""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items) -> None:
    """The `slow` tests here (the packaged models converted: minutes) run only when asked for
    with `-m slow`, so the default suite stays fast."""
    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow")
    for item in items:
        if "slow" in item.keywords and HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Callable[..., Path]:
    """tiny_checkpoint(name, dtype=float32, seed=0) -> a directory holding TINY_CONFIGS[name],
    written by transformers (cached: each combination is written once)."""
    from tests.hf.checkpoints import tiny_model, write_checkpoint

    root = tmp_path_factory.mktemp("tiny_checkpoints")
    made: dict[tuple, Path] = {}

    def make(name: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> Path:
        key = (name, dtype, seed)
        if key not in made:
            directory = root / f"{name}-{str(dtype).removeprefix('torch.')}-{seed}"
            made[key] = write_checkpoint(tiny_model(name, seed), directory, name.split("-")[0], dtype)
        return made[key]

    return make
