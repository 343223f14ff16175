"""The sampler kernel (sample.c) at a 262,144-id vocabulary, Gemma 3's: its AVX2 exp terms give the
portable C's bits, draw and distribution, whatever the settings; rows wide enough that the exp
terms run from 1 down through float32's subnormals (top_p's buckets read those apart)."""

import pytest
import torch

from batchproof.engine.model.ops import kernels
from batchproof.engine.sampling.params import SamplingParams

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the kernels are not built")

SETTINGS = [
    {"temperature": 0.8, "top_p": 0.95},
    {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05},
    {"temperature": 1.0},
    {"temperature": 0.3, "top_p": 0.5},
    {"temperature": 2.0, "top_p": 0.99, "min_p": 1e-30},
    {"temperature": 1.0, "top_p": 0.9999999},
]


def rows() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    out = [torch.randn(262144, generator=generator) * scale for scale in (3.0, 10.0, 60.0)]
    # A row whose terms reach the subnormals: scaled logits spread evenly over [-100, 0].
    out.append(torch.linspace(-100.0, 0.0, 262144)[torch.randperm(262144, generator=generator)])
    out[-1][7] = 0.0  # tied maxima: ties go to the lower id
    return out


def draws(level: int) -> list[tuple[int, torch.Tensor]]:
    kernels.cap_isa_level(level)
    try:
        return [kernels.sample(row, SamplingParams(seed=1, **setting), (j + 0.37) / len(SETTINGS), True)
                for row in rows() for j, setting in enumerate(SETTINGS)]
    finally:
        kernels.cap_isa_level(2)


def test_every_level_draws_the_portable_choice_from_the_portable_distribution(isa) -> None:
    expected = draws(0)
    for (chosen, processed), (want, want_processed) in zip(draws(isa), expected, strict=True):
        assert chosen == want
        assert torch.equal(processed.view(torch.int32), want_processed.view(torch.int32))
