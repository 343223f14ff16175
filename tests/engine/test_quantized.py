"""Weights kept in their GGUF blocks: every block type, on every kernel path (AVX-512, AVX2,
portable C), against gguf.quants' float32 dequantization.

The promise is bitwise: a quantized matmul equals the float32 kernel's matmul on the
dequantized weight (`==`), at any row count, so native and float32 weights give the same
logits; and it stays within float32 rounding of a float64 reference."""

import pytest
import torch
from gguf import GGMLQuantizationType

from batchproof.engine.model.ops import kernels
from batchproof.engine.model.weights import RawTensor, quant_weight
from tests.helpers.quant_blocks import dequantized, random_blocks

pytestmark = pytest.mark.skipif(not kernels.available(), reason="kernels not built here")

Q = GGMLQuantizationType
TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.F16, Q.BF16, Q.F32]


def random_tensor(qtype: Q, rows: int, k: int, seed: int) -> RawTensor:
    return RawTensor(random_blocks(qtype, rows, k, seed), int(qtype), (rows, k))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_quantized_matmul_is_bitwise_the_float32_kernel_on_the_dequantized_weight(qtype, isa):
    k = 512  # two K-quant super-blocks
    raw = random_tensor(qtype, 37, k, seed=int(qtype))  # 37: a ragged last tile of outputs
    weight, dense = quant_weight(raw), dequantized(raw)
    x = torch.randn(17, k, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(37)
    y = kernels.linear_q(x, weight, bias, 2)
    assert torch.equal(y, kernels.linear(x, dense, bias, 2))
    # alone and in other company: 1 to 4 rows unpack in registers, more through a buffer
    for rows in (slice(0, 1), slice(5, 6), slice(8, 10), slice(9, 12), slice(3, 7), slice(16, 17)):
        assert torch.equal(kernels.linear_q(x[rows], weight, bias, 1), y[rows])
    reference = x.double() @ dense.double().T + bias.double()
    assert torch.allclose(y.double(), reference, rtol=1e-5, atol=1e-4 * float(reference.abs().max()))


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q6_K], ids=lambda t: t.name)
def test_the_buffer_s_groups_of_tiles_change_no_bit(qtype, isa):
    """Past four rows a thread unpacks a group of weight tiles (sized to L2) and takes every row
    tile of x through it: many groups, a ragged last tile, one thread or two, the same bits."""
    k = 1024  # tiles of 16 KB, six to a group: 301 outputs (101 tiles) make 17-18 groups
    raw = random_tensor(qtype, 301, k, seed=7)
    weight, dense = quant_weight(raw), dequantized(raw)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(2))
    y = kernels.linear_q(x, weight, None, 2)
    assert torch.equal(y, kernels.linear(x, dense, None, 2))
    assert torch.equal(kernels.linear_q(x, weight, None, 1), y)
    assert torch.equal(kernels.linear_q(x[3:8], weight, None, 3), y[3:8])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_embedding_rows_are_the_dequantized_rows(qtype):
    raw = random_tensor(qtype, 50, 256, seed=7)
    ids = torch.tensor([0, 49, 7, 7, 23])
    assert torch.equal(kernels.dequant_rows(quant_weight(raw), ids), dequantized(raw)[ids])


def test_a_fused_weight_of_mixed_types_fills_each_part_s_columns(isa):
    """Q, K and V of a Q4_K_M file come in different types: one fused output, bias and residual included."""
    parts = [random_tensor(Q.Q4_K, 24, 256, 1), random_tensor(Q.Q6_K, 8, 256, 2), random_tensor(Q.Q4_K, 8, 256, 3),
             random_tensor(Q.Q8_0, 5, 256, 4)]
    weight = quant_weight(*parts)
    assert [p.qtype for p in weight.parts] == [Q.Q4_K, Q.Q6_K, Q.Q4_K, Q.Q8_0] and weight.shape == (45, 256)
    dense = torch.cat([dequantized(p) for p in parts])
    for num_rows in (6, 2, 1):  # one or two rows take the decode kernel (blocks unpacked in registers)
        x, bias = torch.randn(num_rows, 256), torch.randn(45)
        residual = torch.randn(num_rows, 45)
        expected = kernels.linear(x, dense, bias, 2, residual.clone())
        assert torch.equal(kernels.linear_q(x, weight, bias, 2, residual.clone()), expected)


def test_same_type_neighbours_merge_into_one_block_array():
    weight = quant_weight(random_tensor(Q.Q4_1, 9, 64, 1), random_tensor(Q.Q4_1, 3, 64, 2))
    assert len(weight.parts) == 1 and weight.parts[0].rows == 12 and weight.offsets == [0]


def test_types_the_kernels_do_not_run_are_known():
    assert all(kernels.runs_natively(int(t)) for t in TYPES)
    assert not any(kernels.runs_natively(int(t)) for t in (Q.Q8_1, Q.Q2_K, Q.Q3_K, Q.IQ4_NL))


# --- end to end: a tiny model with a different block type in every matmul ----------------------

MIXED = {"token_embd.weight": Q.Q8_0, "output.weight": Q.Q6_K, "blk.0.attn_q.weight": Q.Q4_K,
         "blk.0.attn_k.weight": Q.Q5_0, "blk.0.attn_v.weight": Q.Q6_K, "blk.0.attn_output.weight": Q.Q4_1,
         "blk.0.ffn_gate.weight": Q.Q5_K, "blk.0.ffn_up.weight": Q.Q4_0, "blk.0.ffn_down.weight": Q.Q5_1,
         "blk.1.attn_q.weight": Q.BF16, "blk.1.attn_k.weight": Q.F16, "blk.1.ffn_down.weight": Q.Q8_0}


def records(engine, requests: dict) -> dict[str, list[tuple]]:
    out = engine.generate(requests)
    return {rid: [(r.token_id, r.logprob, tuple((t.token_id, t.logit, t.logprob) for t in r.top))
                  for d in deltas for r in d.records] for rid, deltas in out.items()}


def test_native_weights_give_bitwise_the_float32_path_alone_and_batched(tmp_path):
    from batchproof.engine.config import EngineConfig
    from batchproof.engine.engine import Engine
    from batchproof.engine.sampling.params import SamplingParams
    from tests.helpers.tiny_gguf import TinySpec, write_tiny_gguf

    path = tmp_path / "mixed.gguf"
    write_tiny_gguf(path, TinySpec(dim=256, ffn_dim=512, tensor_types=MIXED, seed=3))
    native = Engine(EngineConfig(model_path=path, device="cpu", max_batch=4))
    dense = Engine(EngineConfig(model_path=path, device="cpu", max_batch=4, weights="float32"))
    assert native.info()["weights"] == "native" and dense.info()["weights"] == "float32"
    assert native.info()["weights_bytes"] < dense.info()["weights_bytes"] / 2
    params = SamplingParams(temperature=0, max_tokens=6, top_logprobs=3, ignore_eos=True)
    prompts = {f"p{i}": (list(range(3, 3 + n)), params) for i, n in enumerate((1, 5, 11, 2))}
    together = records(native, prompts)
    assert together == records(dense, prompts)
    for rid, request in prompts.items():
        assert records(native, {rid: request}) == {rid: together[rid]}
