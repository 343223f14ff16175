"""exp's bits, densely: SiLU and GELU-tanh (the engine's kernels, which reach exp_poly as the
softmax and the logprob normaliser do) over 1,114,114 inputs spanning [-88, 88], hashed and
held to the digest recorded for the numerics version, at every instruction set here.

test_cross_isa's fingerprint sees a few hundred exps; a change that moves exp's last bit
in one input of a hundred thousand (the last bit of its r^5 coefficient does) must change
a digest too, or two builds reporting one version could differ."""

import hashlib

import pytest
import torch

from batchproof.engine.model.ops import kernels

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the kernels are not built here")

# SHA-256 of gated_outputs()'s bits under each numerics version: a change to exp's
# arithmetic fails this until NUMERICS_VERSION is bumped and its digest recorded here.
EXP_DIGESTS = {
    "fixed-order-w8-v1": "b603000bd4decc329ecf6cb278eb5b59c7c78feb462fa4dc0dac7e2c965a1833",
    "fixed-order-w8-v2": "b603000bd4decc329ecf6cb278eb5b59c7c78feb462fa4dc0dac7e2c965a1833",  # exp unchanged
}
FFN = 1021  # a row length that leaves an 8-lane tail



def gates() -> torch.Tensor:
    """[-88, 88] in steps of 88 / 2^19, then [-8, 8] in steps of 2^-12 (where GELU's exp
    argument, -2 sqrt(2 / pi) (x + 0.044715 x^3), sweeps exp's range): every value an
    integer times a power of two, exact in float32, so the inputs are the same anywhere."""
    coarse = (torch.arange(2 ** 20 + 1) - 2 ** 19) * 88
    fine = torch.arange(2 ** 16 + 1) - 2 ** 15
    return torch.cat([coarse.to(torch.float32) / 2 ** 19, fine.to(torch.float32) / 2 ** 12])


def gated_outputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gates, silu(gates), gelu_tanh(gates)), rows of FFN, the up half 1.0 (an exact product)."""
    g = gates()
    rows = -(-g.numel() // FFN)
    gate = torch.cat([g, torch.zeros(rows * FFN - g.numel())]).view(rows, FFN)
    gate_up = torch.cat([gate, torch.ones(rows, FFN)], dim=1)
    return gate, kernels.silu_mul(gate_up), kernels.gelu_tanh_mul(gate_up)


def test_silu_and_gelu_are_the_recorded_bits_of_this_numerics_version(isa):
    gate, silu, gelu = gated_outputs()
    x = gate.double()
    assert torch.allclose(silu.double(), torch.nn.functional.silu(x), rtol=1e-5, atol=1e-6)
    assert torch.allclose(gelu.double(), torch.nn.functional.gelu(x, approximate="tanh"), rtol=1e-5, atol=1e-6)
    version = kernels.numerics_version()
    assert version in EXP_DIGESTS, f"record {version}'s exp digest"
    digest = hashlib.sha256(silu.view(torch.int32).numpy().tobytes() + gelu.view(torch.int32).numpy().tobytes())
    assert digest.hexdigest() == EXP_DIGESTS[version], f"exp's bits moved under {version}"
