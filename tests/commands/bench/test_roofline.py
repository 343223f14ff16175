"""The roofline's arithmetic (bytes and operations times a rate, over this machine's limits) and
the limits themselves: each measurement returns a positive rate, at every instruction-set level
this CPU runs."""

import pytest

from batchproof.commands.bench import roofline
from batchproof.commands.bench.roofline import Footprint, Limits, Roofline
from batchproof.engine.model.ops import kernels

# A 1B-class step: 650 MB of weights, 2 MB of KV; 2.4 GFLOP a token, 2.3 of them in block matmuls.
FOOTPRINT = Footprint(weight_bytes_per_step=650_000_000, kv_bytes_per_step=2_000_000,
                      flops_per_token=2_400_000_000, context=128, block_ops_per_token=2_300_000_000)
LIMITS = Limits(read_gb_s=40.0, fma_peak_gflops=200.0, int_dot_peak_gops=920.0)


def test_c1_reads_bytes_a_step_against_the_bandwidth():
    line = Roofline(FOOTPRINT, LIMITS, c1_tok_s=30.0)
    assert line.c1_gb_s == pytest.approx(652e6 * 30 / 1e9)  # 19.56 GB/s
    assert line.c1_share == pytest.approx(19.56 / 40.0)
    assert line.c16_gflops is line.c16_share is None  # no c=16 band
    assert line.lines()[1].endswith("= 19.56 GB/s, 49% of the read bandwidth")


def test_c16_float32_against_the_fma_peak():
    line = Roofline(FOOTPRINT, LIMITS, numerics="float32", c16_aggregate_tok_s=50.0)
    assert line.c16_gflops == pytest.approx(120.0) and line.c16_int_gops is None
    assert line.c16_share == pytest.approx(120.0 / 200.0)
    assert line.lines()[-1] == "roofline c=16: 50.0 tok/s x 2400 MFLOP = 120.0 GFLOPS, 60% of the FMA peak"


def test_c16_int8_against_the_int_dot_peak():
    """The same rate in the int8 numerics: the block matmuls' integer operations over the
    int-dot peak, not every operation over the FMA peak."""
    line = Roofline(FOOTPRINT, LIMITS, numerics="int8", c16_aggregate_tok_s=200.0)
    assert line.c16_int_gops == pytest.approx(460.0)
    assert line.c16_share == pytest.approx(460.0 / 920.0)
    assert line.lines()[-1] == ("roofline c=16 (int8): 200.0 tok/s x 2300 M integer ops = 460.0 GOPS, "
                                "50% of the int-dot peak")


def test_numerics_is_the_configs_name():
    with pytest.raises(ValueError, match="numerics"):
        Roofline(FOOTPRINT, LIMITS, numerics="batchproof kernels fixed-order-w8-v2, int8 activations")


def test_json_carries_the_limits_and_the_shares():
    figures = Roofline(FOOTPRINT, LIMITS, numerics="int8", c1_tok_s=30.0, c16_aggregate_tok_s=200.0).as_json()
    assert figures["bytes_per_step"] == 652_000_000 and figures["block_ops_per_token"] == 2_300_000_000
    assert (figures["read_gb_s"], figures["fma_peak_gflops"], figures["int_dot_peak_gops"]) == (40.0, 200.0, 920.0)
    assert (figures["c1_gb_s"], figures["c1_share_of_read"]) == (19.56, 0.489)
    assert (figures["c16_int_gops"], figures["c16_share_of_peak"]) == (460.0, 0.5)
    assert figures["numerics"] == "int8" and figures["c16_gflops"] == 480.0


needs_kernels = pytest.mark.skipif(not kernels.available(), reason="the kernels are not built here")


@needs_kernels
@pytest.mark.parametrize("level", [0, 1, 2], ids=lambda level: kernels.ISA_NAMES[level])
def test_each_peak_runs_at_each_level(level):
    """Each spelling (plain C, AVX2, AVX-512 with VNNI where the CPU has it) does work and
    reports it; a few milliseconds each."""
    if kernels.isa_level() < level:
        pytest.skip(f"this CPU has no {kernels.ISA_NAMES[level]}")
    kernels.cap_isa_level(level)
    try:
        assert roofline.fma_peak_gflops(1, seconds=0.02) > 0
        assert roofline.int_dot_peak_gops(1, seconds=0.02) > 0
    finally:
        kernels.cap_isa_level(2)


@needs_kernels
def test_the_read_bandwidth_is_measured():
    """64 MiB once on two threads (the bench sums 1 GiB three times)."""
    assert roofline.read_gb_s(2, num_bytes=64 << 20, runs=1) > 0
    with pytest.raises(ValueError, match="num_bytes"):
        roofline.read_gb_s(2, num_bytes=0)


def test_an_moe_step_reads_the_router_and_the_experts_a_token_uses(tmp_path):
    """A tiny Mixtral (2 layers, 4 experts of 96, 2 used a token; its experts Q8_0, the rest F32):
    each layer's attention, its router and two experts' gate/up and down, the LM head, one
    embedding row; the block matmuls are the experts'."""
    import gguf

    from batchproof.engine.config import EngineConfig
    from batchproof.engine.engine import Engine
    from tests.engine.moe_checkpoints import write_moe_checkpoint, write_moe_gguf

    directory = write_moe_checkpoint("mixtral", tmp_path / "mixtral")
    path = write_moe_gguf("mixtral", directory, tmp_path / "mixtral.gguf", gguf.GGMLQuantizationType.Q8_0)
    engine = Engine(EngineConfig(model_path=path, device="cpu", max_batch=1, num_threads=1))
    got = roofline.footprint(engine, context=10)
    dim, kv, ffn, vocab = 64, 32, 96, 300
    attention_macs, router_macs, expert_macs = (dim + 2 * kv) * dim + dim * dim, 4 * dim, 3 * ffn * dim
    q8_bytes = expert_macs // 32 * 34  # 32 weights in 34 bytes
    layers_bytes = 2 * (4 * (attention_macs + router_macs) + 2 * q8_bytes)
    assert got.weight_bytes_per_step == layers_bytes + 4 * vocab * dim + 4 * dim  # the LM head, one embedding row
    assert got.block_ops_per_token == 2 * 2 * (2 * expert_macs)
    attention_flops = 2 * 2 * (2 * 4 * 16 * 10)  # 2 layers, q.k and p.v over 10 positions, 4 heads of 16
    assert got.flops_per_token == 2 * (2 * (attention_macs + router_macs + 2 * expert_macs) + vocab * dim) \
        + attention_flops
