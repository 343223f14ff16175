"""Fixtures the engine's kernel tests share."""

import pytest

from batchproof.engine.model.ops import kernels


@pytest.fixture(params=[2, 1, 0], ids=lambda level: kernels.ISA_NAMES[level])
def isa(request):
    """Each instruction-set level (AVX-512, AVX2, portable) in turn, capped for the test; a level
    this CPU lacks skips, so the next machine with it runs it."""
    if kernels.isa_level() < request.param:
        pytest.skip(f"this CPU has no {kernels.ISA_NAMES[request.param]}")
    kernels.cap_isa_level(request.param)
    yield request.param
    kernels.cap_isa_level(2)
