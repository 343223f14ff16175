"""The same bits on every x86 host: each instruction-set path of our kernels (AVX-512, AVX2,
portable C) gives bitwise the portable path's result, kernel by kernel and for whole models,
so replicas on machines with different instruction sets give identical logits and logprobs.

Each test runs the portable path (level 0) and every faster level this CPU has, and compares
raw bits (`.view(torch.int32)`: -0.0 is not +0.0 here). The inputs are awkward on purpose:
sizes that leave tails, zeros of both signs, values whose products underflow (a sum of them
is -0.0 unless a zero-padded lane turns it into +0.0), infinities and NaN where a kernel
defines what they do. On a CPU without AVX-512 the AVX-512 cases skip; the fingerprint test
still checks this machine's bits against those recorded on another."""

import hashlib

import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from batchproof.engine.cache.kv_cache import KVCache
from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.ops import kernels
from batchproof.engine.model.transformer import Segment
from batchproof.engine.model.weights import RawTensor, quant_weight
from batchproof.engine.sampling.params import SamplingParams
from tests.helpers.quant_blocks import SCALE_OFFSETS, random_blocks
from tests.helpers.tiny_gguf import TinySpec, write_tiny_gguf

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the kernels are not built here")

Q = GGMLQuantizationType
QUANT_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.F16, Q.BF16, Q.F32]


@pytest.fixture(params=[2, 1], ids=lambda level: kernels.ISA_NAMES[level])
def level(request):
    """A vector level to hold against the portable one."""
    if kernels.isa_level() < request.param:
        pytest.skip(f"this CPU has no {kernels.ISA_NAMES[request.param]}")
    return request.param


def at_level(level: int, compute):
    kernels.cap_isa_level(level)
    try:
        assert kernels.isa_level() == level
        return compute()
    finally:
        kernels.cap_isa_level(2)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32) if t.dtype == torch.float32 else t


def assert_same_bits(level: int, compute) -> None:
    """compute() gives the same tensors, bit for bit, at `level` as on the portable path."""
    expected, got = at_level(0, compute), at_level(level, compute)
    if isinstance(expected, torch.Tensor):
        expected, got = (expected,), (got,)
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        assert e.dtype == g.dtype and e.shape == g.shape
        assert torch.equal(bits(e), bits(g)), f"{int((bits(e) != bits(g)).sum())} of {e.numel()} differ"


def awkward(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    """Normal values with a sprinkle of +0.0, -0.0 and values whose products underflow."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * scale
    flat = x.view(-1)
    picks = torch.randperm(flat.numel(), generator=g)[: max(3, flat.numel() // 8)]
    flat[picks[0::3]] = 0.0
    flat[picks[1::3]] = -0.0
    flat[picks[2::3]] *= 1e-25
    return x


def underflowing_rows(x: torch.Tensor, w: torch.Tensor) -> None:
    """Row 0 of x against row 0 of w: every product underflows to -0.0, so each lane's sum
    is -0.0, and the output's sign rests on how the tail is padded."""
    x[0], w[0] = 1e-30, -1e-30


@pytest.mark.parametrize("k", [1, 5, 8, 13, 70, 131])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_linear_f32(level, k, with_bias):
    x, w = awkward(17, k, seed=k), awkward(37, k, seed=100 + k)  # 37 outputs: a ragged last tile
    underflowing_rows(x, w)
    b = awkward(37, seed=200 + k) if with_bias else None
    residual = awkward(17, 37, seed=300 + k)

    def compute():
        rows = [kernels.linear(x[:m], w, b, 2) for m in range(1, 18)]
        return (*rows, kernels.linear(x, w, b, 2, residual=residual.clone()))

    assert_same_bits(level, compute)


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_linear_on_every_quantized_type_and_its_embedding_rows(level, qtype):
    k = 512  # two K-quant super-blocks
    raw = RawTensor(random_blocks(qtype, 37, k, seed=int(qtype)), int(qtype), (37, k))
    weight = quant_weight(raw)
    x, b = awkward(17, k, seed=int(qtype)), awkward(37, seed=1)
    ids = torch.tensor([0, 36, 7, 7, 19])

    def compute():
        rows = [kernels.linear_q(x[:m], weight, b, 2) for m in range(1, 18)]
        return (*rows, kernels.linear_q(x, weight, None, 1, residual=x[:, :37].clone()),
                kernels.dequant_rows(weight, ids))

    assert_same_bits(level, compute)


@pytest.mark.skipif(not (kernels.available() and kernels.isa_level() >= 2), reason="no AVX-512 here")
@pytest.mark.parametrize("pairs", [True, False], ids=["pairs", "8-lane"])
@pytest.mark.parametrize("qtype", QUANT_TYPES[:8], ids=lambda t: t.name)
def test_every_row_count_at_avx512_pairing_or_not(qtype, pairs):
    """1 to 17 rows of x at the AVX-512 level, the CPU's choice forced either way (the CPU picks:
    not paired on Zen 4): paired, one row takes two weight rows a 16-lane register and 5 to 8 (16
    for Q8_0, Q6_K) rows of x go two a register; not, one row runs the 8-lane code and 5 to 8 the
    tall 8-lane tile (quant.h's TALL_ROWS). Each the portable path's bits."""
    k = 512
    raw = RawTensor(random_blocks(qtype, 37, k, seed=int(qtype) + 3), int(qtype), (37, k))
    weight, x, b = quant_weight(raw), awkward(17, k, seed=int(qtype) + 5), awkward(37, seed=2)
    kernels.prefer_pairs(pairs)
    try:
        assert_same_bits(2, lambda: [kernels.linear_q(x[:m], weight, b, 2) for m in range(1, 18)])
    finally:
        kernels.prefer_pairs(None)


@pytest.mark.parametrize("dim", [1, 7, 8, 13, 70, 576])
def test_rms_norm(level, dim):
    x, weight = awkward(17, dim, seed=dim), awkward(dim, seed=dim + 1)
    x[0], x[1], x[2] = 0.0, -0.0, 1e-30  # a sum of +0s, of -0s (underflowed squares are +0 either way)
    assert_same_bits(level, lambda: kernels.rms_norm(x, weight, 1e-5))


@pytest.mark.parametrize("style", ["adjacent", "halves"])
@pytest.mark.parametrize("rope_dim", [64, 32])  # 32: partial rotary, the rest passes through
def test_rope(level, style, rope_dim):
    heads, head_dim, rows = 3, 64, 17
    table = awkward(40, rope_dim // 2, seed=2), awkward(40, rope_dim // 2, seed=3)
    x = awkward(rows, heads * head_dim + 5, seed=4)  # a wider row: the heads after `heads` stay
    positions = torch.randint(0, 40, (rows,), generator=torch.Generator().manual_seed(5))

    def compute():
        out = x.clone()
        kernels.rope_(out, heads, head_dim, rope_dim, positions, *table, style)
        return out

    assert_same_bits(level, compute)


@pytest.mark.parametrize("ffn", [1, 7, 13, 37, 1539])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_gated_activations(level, ffn, activation):
    gate_up = awkward(17, 2 * ffn, seed=ffn, scale=4.0)
    specials = torch.tensor([float("inf"), float("-inf"), float("nan"), 1e4, -1e4, 90.0, -90.0, 0.0, -0.0, 1e-30])
    gate_up[:10, 0], gate_up[:10, ffn - 1] = specials, specials.flip(0)  # exp's clamps, both zeros, a row's tail
    kernel = kernels.silu_mul if activation == "silu" else kernels.gelu_tanh_mul
    assert_same_bits(level, lambda: (kernel(gate_up), kernel(gate_up[:1])))


def attention_inputs(head_dim: int, seed: int, heads: int = 6, kv_heads: int = 2):
    max_len = 40
    k_cache = awkward(3, kv_heads, max_len, head_dim, seed=seed)
    v_cache = awkward(3, kv_heads, max_len, head_dim, seed=seed + 1)
    q = awkward(17, heads, head_dim, seed=seed + 2)
    return q, k_cache, v_cache, head_dim ** -0.5


@pytest.mark.parametrize("window", [0, 7])
@pytest.mark.parametrize("head_dim", [64, 40, 13])  # 64: the vector path; the others its portable fallback
# query heads a KV head: the vector path runs 3 of a group together, 2 of 4 (attention_group.c), 1 alone
@pytest.mark.parametrize("heads, kv_heads", [(6, 2), (8, 2), (2, 2)], ids=["group-3", "group-4", "group-1"])
def test_decode_attention(level, head_dim, window, heads, kv_heads):
    q, k_cache, v_cache, scale = attention_inputs(head_dim, seed=head_dim + window, heads=heads, kv_heads=kv_heads)
    slots = torch.tensor([i % 3 for i in range(17)])
    lengths = torch.tensor([1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 23, 31, 32, 33, 39, 40])
    assert_same_bits(level, lambda: kernels.decode_attention(q, k_cache, v_cache, slots, lengths, scale, 2, window))


@pytest.mark.parametrize("window", [0, 7])
@pytest.mark.parametrize("head_dim", [64, 40])
@pytest.mark.parametrize("start", [0, 5])
def test_prompt_attention(level, head_dim, window, start):
    q, k_cache, v_cache, scale = attention_inputs(head_dim, seed=head_dim + window + start)
    assert_same_bits(level, lambda: kernels.prompt_attention(q, k_cache, v_cache, 1, start, scale, 2, window))


@pytest.mark.parametrize("vocab", [1, 7, 101, 1003])
@pytest.mark.parametrize("k", [0, 1, 5])
def test_top_k_logprobs(level, vocab, k):
    logits = awkward(8, vocab, seed=vocab + k, scale=5.0)
    logits[1, ::3] = float("nan")
    logits[2, ::2] = float("-inf")
    logits[3] = float("-inf")  # nothing left to normalise
    logits[4, vocab // 2] = float("inf")
    logits[5, ::2] = 1e30  # ties far from zero
    logits[6] = -0.0
    logits[7] = -1.0  # the maximum is zero twice: -0 first, so the row's max is -0
    logits[7, vocab // 3] = -0.0
    logits[7, vocab - 1] = 0.0
    assert_same_bits(level, lambda: kernels.top_k_logprobs(logits, k))


def signature(engine: Engine, prompts: list[list[int]], max_tokens: int) -> list[tuple]:
    """Every generated token, its logprob and top alternatives (logit and logprob) as exact
    bit strings; the prompts are decoded together."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, top_logprobs=5, ignore_eos=True)
    out = engine.generate({str(i): (p, params) for i, p in enumerate(prompts)})
    return [(r.token_id, r.logprob.hex(), tuple((t.token_id, t.logit.hex(), t.logprob.hex()) for t in r.top))
            for i in range(len(prompts)) for d in out[str(i)] for r in d.records]


# Every architecture's fused decode step (layers.c): llama, qwen2 (biases), qwen3 (per-head
# Q/K norms) and gemma3 (also post-norms, GELU, sliding windows, two RoPE tables); the mixed
# file multiplies every block type straight from its blocks. Head size 64 everywhere: the
# attention kernels' vector paths.
TINY_MODELS = {
    "llama": TinySpec("llama", dim=128, num_heads=2, num_kv_heads=1, seed=5),
    "qwen2": TinySpec("qwen2", dim=128, num_heads=2, num_kv_heads=1, pre="qwen2", seed=7),
    "qwen3": TinySpec("qwen3", dim=96, num_heads=2, num_kv_heads=1, head_dim=64, pre="qwen2", seed=8),
    "gemma3": TinySpec("gemma3", num_layers=6, num_heads=2, num_kv_heads=1, head_dim=64, rope_base=1e6,
                       norm_eps=1e-6, tie_embeddings=True, sliding_window=4, seed=6),
    "mixed-quant": TinySpec(dim=256, ffn_dim=512, seed=3, tensor_types={
        "token_embd.weight": Q.Q8_0, "output.weight": Q.Q6_K, "blk.0.attn_q.weight": Q.Q4_K,
        "blk.0.attn_k.weight": Q.Q5_0, "blk.0.attn_v.weight": Q.Q6_K, "blk.0.attn_output.weight": Q.Q4_1,
        "blk.0.ffn_gate.weight": Q.Q5_K, "blk.0.ffn_up.weight": Q.Q4_0, "blk.0.ffn_down.weight": Q.Q5_1,
        "blk.1.attn_q.weight": Q.BF16, "blk.1.attn_k.weight": Q.F16, "blk.1.ffn_down.weight": Q.Q8_0}),
}


@torch.inference_mode()
def prompt_logits(engine: Engine, ids: list[int]) -> torch.Tensor:
    """Every position's full logits from one prefill (prompt attention, prefill matmuls)."""
    s = engine.spec
    cache = KVCache(s.num_layers, 1, s.num_kv_heads, len(ids), s.head_dim, torch.device("cpu"), torch.float32)
    return engine.model.logits(engine.model.prefill([Segment(torch.tensor(ids), 0, 0)], cache))


def assert_same_model_numbers(level: int, engine: Engine, prompts: list[list[int]], max_tokens: int) -> None:
    """The last prompt's logits and the greedy decode of all of them (records read from the
    decode steps' logits), the same bits at `level` as on the portable path."""
    assert_same_bits(level, lambda: prompt_logits(engine, prompts[-1]))
    expected = at_level(0, lambda: signature(engine, prompts, max_tokens))
    assert at_level(level, lambda: signature(engine, prompts, max_tokens)) == expected


@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_a_tiny_model_gives_the_same_logits_and_logprobs(level, name, tmp_path):
    path = tmp_path / f"{name}.gguf"
    write_tiny_gguf(path, TINY_MODELS[name])
    engine = Engine(EngineConfig(model_path=path, device="cpu", max_batch=4))
    assert_same_model_numbers(level, engine, [list(range(3, 3 + n)) for n in (1, 5, 11, 19)], 6)


def test_the_default_model_gives_the_same_logits_and_logprobs(level, engine):
    """SmolLM2-135M (Q4_1, the served default): a short prompt and five greedy steps."""
    prompt = engine.chat_prompt_ids([{"role": "user", "content": "Name a colour."}])
    assert_same_model_numbers(level, engine, [prompt], 5)


# --- the version names the bits --------------------------------------------------------------

# The SHA-256 of fingerprint()'s bits under each numerics version. A change to any kernel's
# arithmetic fails this test until NUMERICS_VERSION (isa.c) is bumped and the new
# version's digest is recorded here: replicas that report one version agree bit for bit.
# Recorded on an AVX2 host; an AVX-512 host running this test checks itself against it.
FINGERPRINTS = {
    "fixed-order-w8-v1": "cf0570a65bcecd3ea10d6173218ec47c16be0c34c7141dd14830e97af3e25b62",
    "fixed-order-w8-v2": "a5097eaa6767d944e5c7547d60fb2ce32bc34464adddf6228538eaaa5e8307f5",
}


def hashed(n: int, seed: int) -> torch.Tensor:
    """n 32-bit integer hashes: inputs that are the same under any torch, numpy or libm (their
    random generators promise no stable streams), so the outputs' digest can be recorded once."""
    i = torch.arange(n, dtype=torch.int64) + seed * 1_000_003
    h = (i * 2654435761 + 12345) % 2**32
    return (h ^ (h >> 15)) * 2246822519 % 2**32


def pseudo_random(n: int, seed: int) -> torch.Tensor:
    """n floats in [-4, 4), each a hash scaled exactly."""
    return ((hashed(n, seed) >> 8).to(torch.float32) - 2**23) / 2**21


def pseudo_blocks(qtype: Q, rows: int, k: int, seed: int) -> RawTensor:
    """A [rows, k] weight of hashed blocks whose float16 scales are ordinary values (+-2^-7 to 2^-6)."""
    if qtype in (Q.F32, Q.F16, Q.BF16):
        values = pseudo_random(rows * k, seed)
        values = {Q.F32: values, Q.F16: values.half(), Q.BF16: (values.view(torch.int32) >> 16).to(torch.int16)}[qtype]
        data = values.view(rows, k).view(torch.uint8).numpy()
    else:
        block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
        blocks = (hashed(rows * k // block_elems * block_bytes, seed) & 0xFF).to(torch.uint8)
        blocks = blocks.view(rows, k // block_elems, block_bytes)
        for offset in SCALE_OFFSETS[qtype]:  # the high byte: the sign, exponent 2^-7, two mantissa bits
            blocks[:, :, offset + 1] = (blocks[:, :, offset + 1] & 0x83) | 0x20
        data = blocks.view(rows, -1).numpy()
    return RawTensor(data, int(qtype), (rows, k))


def fingerprint() -> bytes:
    x, w = pseudo_random(5 * 131, 1).view(5, 131), pseudo_random(37 * 131, 2).view(37, 131)
    q = pseudo_random(5 * 4 * 64, 3).view(5, 4, 64)
    k_cache, v_cache = (pseudo_random(2 * 2 * 24 * 64, seed).view(2, 2, 24, 64) for seed in (4, 5))
    gate_up = pseudo_random(5 * 2 * 77, 6).view(5, 154) * 4
    logits = pseudo_random(3 * 1003, 7).view(3, 1003) * 3
    ids = torch.tensor([3, 4, 5, 6, 7])
    rotated = pseudo_random(5 * 2 * 64, 9).view(5, 128)
    kernels.rope_(rotated, 2, 64, 64, torch.tensor([0, 1, 7, 3, 2]), *pseudo_random(2 * 8 * 32, 10).view(2, 8, 32),
                  "adjacent")
    outputs = [
        kernels.linear(x, w, None, 2),
        kernels.rms_norm(x, w[0], 1e-5),
        kernels.silu_mul(gate_up),
        kernels.gelu_tanh_mul(gate_up),
        kernels.decode_attention(q, k_cache, v_cache, torch.tensor([0, 1, 0, 1, 1]), torch.tensor([1, 6, 17, 23, 24]),
                                 0.125, 2),
        kernels.prompt_attention(q, k_cache, v_cache, 1, 3, 0.125, 2, 4),
        *kernels.top_k_logprobs(logits, 5),
        rotated,
        # v2: the RoPE tables (SmolLM2's shape, and Gemma's with per-frequency factors and a
        # linear factor) and sampled choices with the distributions they drew from.
        *kernels.rope_tables(64, 100000.0, 96, None, 1.0),
        *kernels.rope_tables(256, 1000000.0, 40, pseudo_random(128, 11).abs() + 1, 8.0),
    ]
    for i, params in enumerate([SamplingParams(temperature=0.7), SamplingParams(temperature=1.3, top_k=17),
                                SamplingParams(temperature=0.9, top_p=0.8, min_p=0.02)]):
        chosen, processed = kernels.sample(logits[i], params, (i + 1) / 4, True)
        outputs += [torch.tensor([chosen]), processed]
    for qtype in QUANT_TYPES:
        weight = quant_weight(pseudo_blocks(qtype, 9, 256, seed=int(qtype)))
        outputs.append(kernels.linear_q(pseudo_random(3 * 256, 8).view(3, 256), weight, None, 2))
        outputs.append(kernels.dequant_rows(weight, ids))
    return b"".join(bits(t).numpy().tobytes() for t in outputs)


@pytest.mark.parametrize("isa", [2, 1, 0], ids=lambda level: kernels.ISA_NAMES[level])
def test_the_numerics_version_names_these_bits(isa):
    if kernels.isa_level() < isa:
        pytest.skip(f"this CPU has no {kernels.ISA_NAMES[isa]}")
    version = kernels.numerics_version()
    assert version in FINGERPRINTS, f"record {version}'s fingerprint"
    assert hashlib.sha256(at_level(isa, fingerprint)).hexdigest() == FINGERPRINTS[version]


@pytest.mark.parametrize("max_isa", ["portable", "avx2"])
def test_max_isa_runs_that_level_and_changes_no_bit(max_isa, tmp_path):
    """--max-isa (EngineConfig.max_isa) caps the kernels at load: the engine says which level
    it runs (/v1/server_info's decode_path), and its numbers are an uncapped engine's."""
    level = {"portable": 0, "avx2": 1}[max_isa]
    if kernels.isa_level() < level:
        pytest.skip(f"this CPU has no {max_isa}")
    path = tmp_path / "mixed.gguf"
    write_tiny_gguf(path, TINY_MODELS["mixed-quant"])
    prompts = [list(range(3, 3 + n)) for n in (2, 9)]
    try:
        capped = Engine(EngineConfig(model_path=path, device="cpu", max_batch=4, max_isa=max_isa))
        assert kernels.isa_level() == level
        assert capped.model.ops.decode_path.startswith(f"batchproof-{kernels.ISA_NAMES[level]} ")
        got = signature(capped, prompts, 5)
    finally:
        kernels.cap_isa_level(2)
    uncapped = Engine(EngineConfig(model_path=path, device="cpu", max_batch=4))
    assert signature(uncapped, prompts, 5) == got
