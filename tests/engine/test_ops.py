"""Each backend of the ops, as a unit: the compiled kernels and padded torch, side by side.

Both must give a row the same bits whatever company it keeps: the kernels at any row
count, padded torch at its fixed row count (so each torch case compares a row inside two
batches of the same size but different neighbours). Both must agree with float64.
"""

import math

import pytest
import torch

from batchproof.engine.cache.kv_cache import KVCache
from batchproof.engine.model.ops import HeadLayout, KernelOps, RopeTables, TorchOps, kernels

VOCAB = 49_152  # the default model's: the normaliser's chunking matters at this size
ROWS = 16

BACKENDS = [pytest.param(lambda: TorchOps(padded=True), id="padded-torch"),
            pytest.param(lambda: KernelOps(num_threads=2), id="kernels",
                         marks=pytest.mark.skipif(not kernels.available(), reason="kernels not built here"))]


def company(x: torch.Tensor, r: int, ops, padded: bool = True) -> list[tuple[torch.Tensor, int]]:
    """Row r of x in several settings: (batch, row index). Among the other rows and among
    the same rows reversed (the same row count); and alone, unless the op runs padded."""
    settings = [(x, r), (x.flip(0).contiguous(), x.shape[0] - 1 - r)]
    if isinstance(ops, KernelOps) or not padded:
        settings.append((x[r:r + 1].contiguous(), 0))
    return settings


def logits_batch() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(ROWS, VOCAB, generator=gen) * 6
    logits[3, 100] = 1e30
    logits[5, ::7] = float("nan")
    logits[7, :VOCAB // 2] = float("-inf")
    return logits


@pytest.mark.parametrize("make", BACKENDS)
def test_normalizer_and_top_n_are_row_invariant_at_the_real_vocabulary(make):
    """Logprobs run on the real rows only (never padded), so every backend must give a row
    the same bits alone as in a batch of 16."""
    ops = make()
    logits = logits_batch()
    chosen = torch.arange(ROWS, dtype=torch.int64)[:, None] * 997
    norm, top = ops.normalizer_and_top_k(logits, 20)
    expected = norm.logprobs(chosen)
    for r in range(ROWS):
        for batch, i in company(logits, r, ops, padded=False):
            n, t = ops.normalizer_and_top_k(batch, 20)
            assert torch.equal(t.ids[i], top.ids[r])
            assert torch.equal(t.logprobs[i], top.logprobs[r])
            assert torch.equal(n.logprobs(chosen[r:r + 1].expand(batch.shape[0], 1))[i], expected[r])


@pytest.mark.parametrize("make", BACKENDS)
def test_normalizer_matches_float64(make):
    logits = logits_batch()[[0, 1, 5]]
    norm, top = make().normalizer_and_top_k(logits, 5)
    clean = torch.where(logits.isnan(), float("-inf"), logits).double()
    reference = torch.log_softmax(clean, -1)
    assert torch.allclose(top.logprobs.double(), reference.gather(-1, top.ids), atol=2e-5)
    assert top.ids.tolist() == clean.topk(5).indices.tolist()


@pytest.mark.parametrize("make", BACKENDS)
def test_matmul_norm_and_activation_are_row_invariant(make):
    ops = make()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(ROWS, 576, generator=gen)
    w = torch.randn(1536, 576, generator=gen) / 24
    b = torch.randn(1536, generator=gen)
    norm_w = torch.rand(576, generator=gen) + 0.5
    full_linear = ops.linear(x, w, b)
    full_norm = ops.rms_norm(x, norm_w, 1e-5)
    full_act = ops.silu_mul(full_linear)
    for r in (0, 5, ROWS - 1):
        for batch, i in company(x, r, ops):
            assert torch.equal(ops.linear(batch, w, b)[i], full_linear[r])
            assert torch.equal(ops.rms_norm(batch, norm_w, 1e-5)[i], full_norm[r])
            assert torch.equal(ops.silu_mul(ops.linear(batch, w, b))[i], full_act[r])
    x64 = x.double()
    assert torch.allclose(full_linear.double(), x64 @ w.double().T + b.double(), atol=1e-4)
    expected_norm = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * norm_w.double()
    assert torch.allclose(full_norm.double(), expected_norm, atol=1e-5)
    gate, up = full_linear.double().chunk(2, dim=-1)
    assert torch.allclose(full_act.double(), gate * torch.sigmoid(gate) * up, atol=1e-4)


@pytest.mark.parametrize("make", BACKENDS)
def test_residual_is_added(make):
    ops = make()
    gen = torch.Generator().manual_seed(2)
    x, w, residual = torch.randn(4, 64, generator=gen), torch.randn(32, 64, generator=gen), torch.randn(4, 32)
    expected = residual.double() + x.double() @ w.double().T
    assert torch.allclose(ops.linear(x, w, residual=residual.clone()).double(), expected, atol=1e-4)


@pytest.mark.parametrize("make", BACKENDS)
@pytest.mark.parametrize("style", ["adjacent", "halves"])
def test_qkv_heads_and_decode_attention(make, style):
    """RoPE'd heads and attention over each sequence's own keys: row-invariant, and the
    same on both backends to float32 rounding."""
    ops = make()
    layout = HeadLayout(num_heads=4, num_kv_heads=2, head_dim=16, rope_dim=16, rope_style=style, norm_eps=1e-5)
    gen = torch.Generator().manual_seed(3)
    angles = torch.outer(torch.arange(64, dtype=torch.float32), 1.0 / 10000 ** (torch.arange(0, 16, 2) / 16))
    rope = RopeTables(angles.cos(), angles.sin())
    rows = 6
    qkv = torch.randn(rows, (4 + 2 + 2) * 16, generator=gen)
    positions = torch.tensor([3, 10, 0, 7, 20, 1])
    q, k, v = ops.qkv_heads(qkv.clone(), layout, positions, rope, None, None)
    q_ref, k_ref, _ = TorchOps(padded=True).qkv_heads(qkv.clone(), layout, positions, rope, None, None)
    assert torch.allclose(q, q_ref, atol=1e-6) and torch.allclose(k, k_ref, atol=1e-6)

    cache = KVCache(1, rows, 2, 32, 16, torch.device("cpu"), torch.float32)
    cache.k.normal_(generator=gen)
    cache.v.normal_(generator=gen)
    slots, lengths = torch.arange(rows), positions + 1
    scale = 1 / math.sqrt(16)
    out = ops.decode_attention(q, cache, 0, slots, lengths, scale)
    for r in range(rows):
        keys, values = cache.view(0, r, int(lengths[r]))  # [kv_heads, len, hd]
        group = q[r].double().unflatten(0, (2, 2))  # [kv_heads, group, hd]
        weights = torch.softmax(group @ keys.double().transpose(-1, -2) * scale, -1)
        assert torch.allclose(out[r].double(), (weights @ values.double()).flatten(0, 1), atol=1e-5)
        if isinstance(ops, KernelOps):
            alone = ops.decode_attention(q[r:r + 1], cache, 0, slots[r:r + 1], lengths[r:r + 1], scale)
            assert torch.equal(alone[0], out[r])


def test_the_choice_is_made_once_by_device_dtype_and_invariance():
    from batchproof.engine.model.ops import choose_ops

    cpu = torch.device("cpu")
    assert isinstance(choose_ops(cpu, torch.float32, False, 2), TorchOps)
    assert not choose_ops(cpu, torch.float32, False, 2).padded
    assert isinstance(choose_ops(cpu, torch.bfloat16, True, 2), TorchOps)
    assert choose_ops(cpu, torch.bfloat16, True, 2).padded
    if kernels.available():
        assert isinstance(choose_ops(cpu, torch.float32, True, 2), KernelOps)
