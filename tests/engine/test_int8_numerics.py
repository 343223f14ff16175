"""The int8 numerics (--numerics int8, quant_int8.h): three routes to one answer.

- Every instruction set gives the same bits (the portable twin spells the definition out in
  scalar C; the AVX2 twin and the AVX-512 VNNI twin sum the integers other ways and vectorize
  across outputs), at every row count and at the integer sums' bounds.
- The portable twin is the definition: a reference written here from quant_int8.h's text alone
  (exact rationals, each float operation rounded once to float32) gives the same bits.
- A row's result is the same alone, at any position among other rows, and at any thread count.
And it approximates the float32 path closely (an approximation, never called the same).

Weights: every quantized type we run, with scales at the edges (float16 subnormals, zeros of
both signs, +-65504) and 6-bit / int8 sub-block scales at theirs; x with blocks of zeros, one
infinity, one NaN, and values at rounding ties.
"""

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from batchproof.engine.model.ops import kernels
from batchproof.engine.model.weights import RawTensor, quant_weight
from tests.engine.test_quant_register_path import REGISTER_TYPES, edge_blocks, shape_of
from tests.helpers.quant_blocks import SCALE_OFFSETS, bits, dequantized, random_blocks

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the kernels are not built here")

Q = GGMLQuantizationType
LEVELS = (2, 1, 0)  # AVX-512 (where the CPU has it), AVX2, portable


@pytest.fixture(autouse=True)
def _restore_isa():
    yield
    kernels.cap_isa_level(2)


def hostile_x(m: int, k: int, seed: int) -> torch.Tensor:
    """Rows of ordinary values, with a block of zeros, one holding +inf, one a NaN, one of exact
    rounding ties (x * 127 / amax at .5), and rows of tiny and huge magnitudes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    x[0, 32:64] = 0.0
    if m > 1:
        x[1, 0:32] = torch.arange(32) - 15.5  # amax 15.5: x * 127 / 15.5 lands between integers often
        x[1, 64:96] = 1e-38 * torch.randn(32, generator=g)  # below 2^-100: counts as zeros
        x[1, 96:128] = 2.0 ** -99 * torch.randn(32, generator=g)  # above it: 127 / amax is near float32's top
    if m > 2:
        x[2, 96] = float("inf")
        x[2, 0] = float("nan")
    if m > 3:
        x[3] *= 1e30
    return x


def run(qtype: Q, raw, x: torch.Tensor, level: int, threads: int = 1) -> torch.Tensor:
    kernels.cap_isa_level(level)
    return kernels.linear_q_int8(x, kernels.int8_layout(quant_weight(raw)), None, threads)


@pytest.mark.parametrize("qtype", REGISTER_TYPES, ids=lambda t: t.name)
def test_every_instruction_set_gives_the_same_bits(qtype):
    raw = edge_blocks(qtype, *shape_of(qtype), seed=int(qtype) + 7)
    for m in (1, 2, 5, 17):
        x = hostile_x(m, raw.shape[1], seed=m)
        outs = [run(qtype, raw, x, level) for level in LEVELS]
        for level, out in zip(LEVELS[1:], outs[1:]):
            assert torch.equal(bits(out), bits(outs[0])), f"{m} rows: level {level} differs from level 2"


def cpu_has_vnni() -> bool:
    """AVX-512 VNNI on this CPU, as Linux lists its flags (the kernels ask the CPU itself: isa.c's
    bp_isa_vnni); elsewhere we cannot tell, and the tests that need it skip."""
    try:
        return "avx512_vnni" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


needs_vnni = pytest.mark.skipif(not (kernels.available() and kernels.isa_level() >= 2 and cpu_has_vnni()),
                                reason="no AVX-512 VNNI here: the AVX-512 level runs the AVX2 twin's tiles")


def odd_shape(qtype: Q) -> tuple[int, int]:
    """101 outputs (a ragged last tile), and an odd number of blocks: 3 super-blocks, or 7 blocks of 32."""
    return 101, 768 if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K) else 224


@needs_vnni
@pytest.mark.parametrize("qtype", REGISTER_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("outputs", [101, 92, 8], ids=lambda n: f"{n}-outputs")
def test_the_vnni_twin_is_the_portable_twin_at_every_row_count(qtype, outputs):
    """1 to 20 rows (a tile call takes 16: 17-20 make a second of 1-4), against the portable twin
    and the AVX2 twin, bit for bit. The VNNI twin runs tile u beside tile u + half in 16 lanes
    (quant_int8_avx512.c): 101 outputs leave an odd 13th tile, ragged, paired with itself; 92 pair
    a ragged 12th with the 6th; 8 are one tile, paired with itself."""
    raw = edge_blocks(qtype, outputs, odd_shape(qtype)[1], seed=int(qtype) + 13)
    x = hostile_x(20, raw.shape[1], seed=int(qtype))
    for m in range(1, 21):
        vnni, avx2, portable = (run(qtype, raw, x[:m], level) for level in (2, 1, 0))
        assert torch.equal(bits(vnni), bits(portable)), f"{m} rows: the VNNI twin differs from the portable"
        assert torch.equal(bits(avx2), bits(portable)), f"{m} rows: the AVX2 twin differs from the portable"
    tail = x[3:20]  # the hostile rows elsewhere in the tile
    assert torch.equal(bits(run(qtype, raw, tail, 2)), bits(run(qtype, raw, tail, 0)))


@pytest.mark.skipif(not (kernels.available() and kernels.isa_level() >= 2), reason="no AVX-512 here")
@pytest.mark.parametrize("qtype", REGISTER_TYPES, ids=lambda t: t.name)
def test_an_avx512_cpu_without_vnni_gives_the_portable_twin_s_bits(qtype):
    """What an AVX-512 CPU without VNNI runs (AVX-512's quantize of x, the AVX2 twin's tiles), here
    with VNNI turned off whether the CPU has it or not, against the portable twin."""
    raw = edge_blocks(qtype, *odd_shape(qtype), seed=int(qtype) + 17)
    x = hostile_x(20, raw.shape[1], seed=int(qtype) + 1)
    kernels.allow_vnni(False)
    try:
        for m in (1, 2, 3, 4, 5, 8, 16, 17, 20):
            assert torch.equal(bits(run(qtype, raw, x[:m], 2)), bits(run(qtype, raw, x[:m], 0))), f"{m} rows"
    finally:
        kernels.allow_vnni(True)


def extreme_blocks(qtype: Q, rows: int, k: int) -> RawTensor:
    """Every quant at an end of its range (the largest unsigned, or Q8_0's -128 and 127, Q6_K's
    -32 and 31), row by row; K-quant sub-block scales at theirs (6-bit 63, int8 -128 and 127); the
    float16 scales 1 and -1, so each output is the integer sum itself, up to the x scales."""
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    blocks = np.empty((rows, k // block_elems, block_bytes), dtype=np.uint8)
    for r in range(rows):
        fill = {Q.Q8_0: (0x80, 0x7F), Q.Q6_K: (0x00, 0xFF)}.get(qtype, (0xFF, 0x00))[r % 2]
        blocks[r] = fill if r % 4 < 2 or qtype not in (Q.Q8_0, Q.Q6_K) else 0xFF - fill
        for offset in SCALE_OFFSETS[qtype]:
            blocks[r, :, offset:offset + 2] = np.array([1.0 if r % 3 else -1.0], dtype=np.float16).view(np.uint8)
        if qtype in (Q.Q4_K, Q.Q5_K):
            blocks[r, :, 4:16] = 0xFF  # every sub-block's scale and min 63
        if qtype == Q.Q6_K:
            blocks[r, :, 192:208] = 0x80 if r % 2 else 0x7F
    return RawTensor(np.ascontiguousarray(blocks.reshape(rows, -1)), int(qtype), (rows, k))


@pytest.mark.parametrize("qtype", REGISTER_TYPES, ids=lambda t: t.name)
def test_every_instruction_set_agrees_at_the_integer_bounds(qtype):
    """The largest integer sums each type can make (every |q_x| 127, of one sign or alternating,
    against quants at their ends): no twin overflows or saturates; the definition's answer."""
    k = 512 if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K) else 128
    raw = extreme_blocks(qtype, 12, k)
    x = torch.ones(6, k)
    x[1] = -1.0
    x[2, 1::2] = -1.0
    x[3, 0::2] = -1.0
    x[4, :k // 2] = -1.0
    x[5, 16::32] = 0.5  # one q of 64 a block, the rest 127
    expected = reference(qtype, raw, x)
    for level in LEVELS:
        if kernels.isa_level() >= level:
            got = run(qtype, raw, x, level)
            assert torch.equal(bits(got), bits(expected)), f"level {level}"


@pytest.mark.parametrize("qtype", REGISTER_TYPES, ids=lambda t: t.name)
def test_a_row_is_the_same_alone_anywhere_in_a_batch_and_on_any_thread_count(qtype):
    raw = edge_blocks(qtype, *shape_of(qtype), seed=int(qtype) + 3)
    x = hostile_x(19, raw.shape[1], seed=5)
    whole = run(qtype, raw, x, 2, threads=2)
    for i in (0, 3, 16, 18):
        alone = run(qtype, raw, x[i:i + 1], 2, threads=1)
        assert torch.equal(bits(alone[0]), bits(whole[i]))
        shuffled = run(qtype, raw, torch.cat([x[i + 1:], x[:i + 1]]), 1, threads=2)
        assert torch.equal(bits(shuffled[-1]), bits(whole[i]))


# ---- the reference: quant_int8.h's definition, from its text, in exact arithmetic ----

def f32(value) -> np.float32:
    """A rational (or float) rounded once to the nearest float32, ties to even."""
    if isinstance(value, float) and not np.isfinite(value):
        return np.float32(value)
    exact = Fraction(value)
    near = np.float32(float(exact))
    if not np.isfinite(near):
        return near
    candidates = [near, np.nextafter(near, np.float32(np.inf)), np.nextafter(near, np.float32(-np.inf))]

    def key(c):
        return abs(Fraction(float(c)) - exact), int(np.array(c).view(np.int32)) & 1
    return min((c for c in candidates if np.isfinite(c)), key=key)


def fma(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
    if not (np.isfinite(a) and np.isfinite(b) and np.isfinite(c)):
        return np.float32(np.float64(a) * np.float64(b) + np.float64(c))
    return f32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))


def quantize_row(row: np.ndarray):
    """Step 1: per block of 32, (q, d, sx, sum_lo, sum_hi)."""
    out = []
    for b in range(len(row) // 32):
        x = row[32 * b:32 * b + 32]
        amax = np.max(np.abs(x)) if not np.isnan(x).any() else np.float32(np.nan)
        if not np.isfinite(amax) or amax < 2.0 ** -100:
            d = np.float32(0.0) if amax < 2.0 ** -100 else np.float32(np.nan)
            q = np.zeros(32, dtype=np.int64)
        else:
            inv = f32(Fraction(127) / Fraction(float(amax)))
            q = np.array([round(Fraction(float(f32(Fraction(float(v)) * Fraction(float(inv)))))) for v in x],
                         dtype=np.int64)  # Python's round of a Fraction: half to even
            q = np.clip(q, -127, 127)
            d = f32(Fraction(float(amax)) / 127)
        lo, hi = int(q[:16].sum()), int(q[16:].sum())
        sx = f32(Fraction(float(d)) * (lo + hi)) if np.isfinite(d) else np.float32(np.nan)
        out.append((q, d, sx))
    return out


def weight_groups(qtype: Q, row: np.ndarray):
    """Each group of 32 of one weight row: (integers w with their zero taken off, Q6_K's two
    scales (else 1, 1), dw, mw), from the block layouts (gguf.quants')."""
    elems, size = GGML_QUANT_SIZES[qtype]
    half = lambda b, at: np.frombuffer(bytes(b[at:at + 2]), dtype=np.float16)[0].astype(np.float32)  # noqa: E731
    for blk in row.reshape(-1, size):
        if qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0):
            d = half(blk, 0)
            mw = half(blk, 2) if qtype in (Q.Q4_1, Q.Q5_1) else np.float32(0)
            if qtype == Q.Q8_0:
                w = blk[2:34].view(np.int8).astype(np.int64)
            else:
                qs = blk[{Q.Q4_0: 2, Q.Q4_1: 4, Q.Q5_0: 6, Q.Q5_1: 8}[qtype]:][:16].astype(np.int64)
                w = np.concatenate([qs & 15, qs >> 4])
                if qtype in (Q.Q5_0, Q.Q5_1):
                    qh = int.from_bytes(bytes(blk[2 if qtype == Q.Q5_0 else 4:][:4]), "little")
                    w = w | np.array([(qh >> j & 1) << 4 for j in range(32)])
                w = w - {Q.Q4_0: 8, Q.Q5_0: 16}.get(qtype, 0)
            yield w, (1, 1), d, mw
        elif qtype in (Q.Q4_K, Q.Q5_K):
            d, dmin, s = half(blk, 0), half(blk, 2), blk[4:16].astype(np.int64)
            for g in range(8):
                sc, m = (s[g] & 63, s[g + 4] & 63) if g < 4 else \
                    ((s[g + 4] & 15) | (s[g - 4] >> 6) << 4, (s[g + 4] >> 4) | (s[g] >> 6) << 4)
                qs = blk[(48 if qtype == Q.Q5_K else 16) + 32 * (g // 2):][:32].astype(np.int64)
                w = (qs >> (4 * (g % 2))) & 15
                if qtype == Q.Q5_K:
                    w = w | ((blk[16:48].astype(np.int64) >> g) & 1) << 4
                yield w, (1, 1), f32(Fraction(float(d)) * int(sc)), -f32(Fraction(float(dmin)) * int(m))
        else:  # Q6_K
            d = half(blk, 208)
            for g in range(8):
                h, quarter = g // 4, g % 4
                ql = blk[64 * h + 32 * (quarter % 2):][:32].astype(np.int64)
                qh = blk[128 + 32 * h:][:32].astype(np.int64)
                w = (((ql >> (4 * (quarter // 2))) & 15) | ((qh >> (2 * quarter)) & 3) << 4) - 32
                sc = blk[192:208].view(np.int8)
                yield w, (int(sc[2 * g]), int(sc[2 * g + 1])), d, np.float32(0)


def reference(qtype: Q, raw, x: torch.Tensor) -> torch.Tensor:
    has_min = qtype in (Q.Q4_1, Q.Q5_1, Q.Q4_K, Q.Q5_K)
    out = np.zeros((x.shape[0], raw.shape[0]), dtype=np.float32)
    rows = [quantize_row(r) for r in x.numpy()]
    for n in range(raw.shape[0]):
        groups = list(weight_groups(qtype, raw.data[n]))
        for i, blocks in enumerate(rows):
            acc = np.float32(0)
            for (w, (sa, sb), dw, mw), (q, d, sx) in zip(groups, blocks, strict=True):
                isum = sa * int(w[:16] @ q[:16]) + sb * int(w[16:] @ q[16:])
                s = f32(Fraction(float(dw)) * Fraction(float(d))) if np.isfinite(dw) and np.isfinite(d) \
                    else np.float32(dw * d)
                acc = fma(s, np.float32(isum), acc)
                if has_min:
                    acc = fma(mw, sx, acc)
            out[i, n] = acc
    return torch.from_numpy(out)


@pytest.mark.parametrize("qtype", REGISTER_TYPES, ids=lambda t: t.name)
def test_the_portable_twin_is_the_definition(qtype):
    k = 512 if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K) else 128
    raw = edge_blocks(qtype, 12, k, seed=int(qtype) + 11)
    x = hostile_x(4, k, seed=int(qtype))
    got, expected = run(qtype, raw, x, 0), reference(qtype, raw, x)
    wrong = torch.nonzero(bits(got) != bits(expected))
    assert not len(wrong), f"{len(wrong)} differ, first {wrong[0].tolist()}: {got[tuple(wrong[0])]!r} " \
                           f"against {expected[tuple(wrong[0])]!r}"


@pytest.mark.parametrize("qtype", REGISTER_TYPES, ids=lambda t: t.name)
def test_it_approximates_the_float32_path(qtype):
    """Ordinary weights and activations: each output within a small part of the float path's
    row scale (int8 per block of 32 keeps ~2 decimal digits of each activation)."""
    n, k = 64, 1024
    raw = RawTensor(random_blocks(qtype, n, k, seed=1), int(qtype), (n, k))
    x = torch.randn(8, k, generator=torch.Generator().manual_seed(2))
    exact = x @ dequantized(raw).T
    approx = kernels.linear_q_int8(x, kernels.int8_layout(quant_weight(raw)), None, 2)
    scale = exact.abs().mean()
    assert ((approx - exact).abs().max() / scale) < 0.05


# ---- whole models in the int8 numerics ----

def int8_engine(path=None, **settings):
    from batchproof.engine.config import EngineConfig
    from batchproof.engine.engine import Engine
    return Engine(EngineConfig(model_path=path, device="cpu", numerics="int8", **settings))


@pytest.mark.parametrize("name", ["llama", "gemma3", "mixed-quant"])
def test_a_tiny_model_in_int8_gives_the_same_numbers_on_every_instruction_set(name, tmp_path):
    """Prefill logits and greedy decode records (the fused decode step, layers.c), portable == AVX2
    (== AVX-512 where the CPU has it), for an architecture of each kind and every block type."""
    from tests.engine.test_cross_isa import TINY_MODELS, assert_same_model_numbers
    from tests.helpers.tiny_gguf import write_tiny_gguf
    path = tmp_path / f"{name}.gguf"
    write_tiny_gguf(path, TINY_MODELS[name])
    engine = int8_engine(path, max_batch=4)
    for level in (2, 1):
        if kernels.isa_level() >= level:
            assert_same_model_numbers(level, engine, [list(range(3, 3 + n)) for n in (1, 5, 11, 19)], 6)


def test_the_fused_decode_step_is_the_op_by_op_path(tmp_path):
    """layers.c's int8 matmuls (the numerics passed in bp_shape) and the per-op path's: one answer."""
    from tests.engine.test_cross_isa import TINY_MODELS, signature
    from tests.helpers.tiny_gguf import write_tiny_gguf
    path = tmp_path / "mixed.gguf"
    write_tiny_gguf(path, TINY_MODELS["mixed-quant"])
    engine = int8_engine(path, max_batch=4)
    prompts = [list(range(3, 3 + n)) for n in (2, 7, 13)]
    fused = signature(engine, prompts, 6)
    engine.model.ops.is_fused = False
    try:
        assert signature(engine, prompts, 6) == fused
    finally:
        engine.model.ops.is_fused = True


def test_int8_is_asked_for_where_it_exists():
    from batchproof.common.config import ConfigError
    from batchproof.engine.config import EngineConfig
    from batchproof.engine.model.ops import choose_ops
    with pytest.raises(ConfigError, match="needs weights native"):
        EngineConfig(numerics="int8", weights="float32")
    with pytest.raises(ValueError, match="runs on our CPU kernels only"):
        choose_ops(torch.device("cpu"), torch.float32, False, 1, "int8")


# The SHA-256 of int8_fingerprint()'s bits per int8 numerics version (kernels.INT8_NUMERICS):
# recorded on an AVX2 host; a host with another instruction set checks itself against it.
INT8_FINGERPRINTS = {
    "int8a-b32-v1": "828c29288ad06f0cb41f90d92bfed4e6352c248e36e2e4120ad8699d329a5f0e",
}


def int8_fingerprint() -> bytes:
    from tests.engine.test_cross_isa import pseudo_blocks, pseudo_random
    out = []
    for qtype in REGISTER_TYPES:
        weight = kernels.int8_layout(quant_weight(pseudo_blocks(qtype, 9, 256, seed=int(qtype))))
        out.append(kernels.linear_q_int8(pseudo_random(5 * 256, 8).view(5, 256), weight, None, 2))
    return b"".join(bits(t).numpy().tobytes() for t in out)


@pytest.mark.parametrize("level", LEVELS, ids=lambda level: kernels.ISA_NAMES[level])
def test_the_int8_version_names_these_bits(level):
    import hashlib
    if kernels.isa_level() < level:
        pytest.skip(f"this CPU has no {kernels.ISA_NAMES[level]}")
    kernels.cap_isa_level(level)
    digest = hashlib.sha256(int8_fingerprint()).hexdigest()
    assert INT8_FINGERPRINTS.get(kernels.INT8_NUMERICS) == digest, f"record {kernels.INT8_NUMERICS}: {digest}"


@pytest.mark.parametrize("qtype", REGISTER_TYPES, ids=lambda t: t.name)
def test_the_embedding_rows_read_from_the_int8_layout_are_gguf_s_floats(qtype):
    """A tied LM head is held once, in the int8 layout: looking rows up there gives bitwise the
    file's dequantized rows (every row of a ragged last tile too)."""
    raw = edge_blocks(qtype, *shape_of(qtype), seed=int(qtype) + 5)
    blocks = quant_weight(raw)
    ids = torch.tensor([0, 7, 8, 50, raw.shape[0] - 1, 3, 3])
    assert torch.equal(bits(kernels.dequant_rows(kernels.int8_layout(blocks), ids)),
                       bits(kernels.dequant_rows(blocks, ids)))


def test_repacked_from_the_file_a_piece_at_a_time_is_the_same_weight(monkeypatch):
    """int8_weight repacks the file's rows in pieces (pages dropped as read), same-type neighbours
    merged into one part: the same layout, bit for bit, as repacking the whole weight at once;
    a tensor whose rows leave a tile part-filled is copied first."""
    monkeypatch.setattr(kernels, "COPY_CHUNK_BYTES", 3000)  # several pieces per tensor
    k = 512
    tensors = [RawTensor(random_blocks(q, rows, k, seed=rows), int(q), (rows, k))
               for q, rows in ((Q.Q4_K, 40), (Q.Q4_K, 24), (Q.Q6_K, 13), (Q.Q8_0, 12), (Q.Q8_0, 9))]
    whole = kernels.int8_layout(quant_weight(*tensors))
    pieces = kernels.int8_weight(*tensors)
    assert [p.layout for p in pieces.parts] == ["int8x8"] * 3 and pieces.shape == whole.shape
    for a, b in zip(pieces.parts, whole.parts, strict=True):
        assert (a.qtype, a.rows) == (b.qtype, b.rows) and np.array_equal(a.data, b.data)
