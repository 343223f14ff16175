"""Fixtures the engine's kernel tests share."""

import pytest

from batchproof.engine.model.ops import kernels
from tests.helpers.tiny_gguf import TinySpec, write_tiny_gguf


@pytest.fixture(params=[2, 1, 0], ids=lambda level: kernels.ISA_NAMES[level])
def isa(request):
    """Each instruction-set level (AVX-512, AVX2, portable) in turn, capped for the test; a level
    this CPU lacks skips, so the next machine with it runs it."""
    if kernels.isa_level() < request.param:
        pytest.skip(f"this CPU has no {kernels.ISA_NAMES[request.param]}")
    kernels.cap_isa_level(request.param)
    yield request.param
    kernels.cap_isa_level(2)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory) -> list:
    """Two tiny llama GGUFs of the same shapes (seeds 0 and 1: an old and a new checkpoint)."""
    directory = tmp_path_factory.mktemp("swap")
    paths = []
    for seed in (0, 1):
        path = directory / f"tiny-{seed}.gguf"
        write_tiny_gguf(path, TinySpec("llama", seed=seed))
        paths.append(path)
    return paths
