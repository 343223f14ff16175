"""Every instruction-set path of our kernels (AVX-512, AVX2, portable C), run on this
machine: each agrees with a float64 reference and is batch-invariant on its own. CI or a
user may land on any of them."""

import re
from pathlib import Path

import pytest
import torch

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.ops import kernels
from batchproof.engine.sampling.params import SamplingParams
from tests.helpers.tiny_gguf import TinySpec, reference_logits, write_tiny_gguf

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the kernels are not built here")
LEVELS = [level for level in (2, 1, 0) if kernels.available() and level <= kernels.isa_level()]
CSRC = Path(kernels.__file__).parent / "csrc"  # the C sources


@pytest.fixture(params=LEVELS, ids=lambda level: kernels.ISA_NAMES[level])
def isa(request):
    kernels.cap_isa_level(request.param)
    assert kernels.isa_level() == request.param
    yield request.param
    kernels.cap_isa_level(2)


def test_linear_is_the_same_for_any_row_count_position_and_company(isa):
    torch.manual_seed(isa)
    w, b = torch.randn(37, 70), torch.randn(37)  # odd sizes: every tail path runs
    x = torch.randn(9, 70)
    full = kernels.linear(x, w, b, 2)
    assert torch.allclose(full.double(), (x.double() @ w.double().T + b.double()), atol=1e-4)
    for row in range(9):
        alone = kernels.linear(x[row:row + 1], w, b, 1)[0]
        moved = kernels.linear(torch.roll(x, 3, 0), w, b, 2)[(row + 3) % 9]
        assert torch.equal(alone, full[row]) and torch.equal(moved, full[row])
    residual = torch.randn(9, 37)
    expected = residual + full
    assert torch.equal(kernels.linear(x, w, b, 2, residual=residual.clone()), expected)


def test_norm_silu_and_top_k_per_row(isa):
    torch.manual_seed(10 + isa)
    x, weight = torch.randn(5, 70), torch.randn(70)
    normed = kernels.rms_norm(x, weight, 1e-5)
    reference = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5) * weight.double()
    assert torch.allclose(normed.double(), reference, atol=1e-5)
    gate_up = torch.randn(5, 2 * 37) * 4
    act = kernels.silu_mul(gate_up)
    assert torch.allclose(act.double(), torch.nn.functional.silu(gate_up[:, :37].double()) * gate_up[:, 37:].double(),
                          rtol=1e-5, atol=1e-6)
    logits = torch.randn(3, 101) * 5
    ids, values, row_max, log_total, counts = kernels.top_k_logprobs(logits, 4)
    assert ids.tolist() == [sorted(range(101), key=lambda i: (-float(r[i]), i))[:4] for r in logits]
    lse = torch.logsumexp(logits.double(), -1)
    assert torch.allclose((row_max + log_total).double(), lse, atol=1e-5)
    for row in range(5):
        assert torch.equal(kernels.rms_norm(x[row:row + 1], weight, 1e-5)[0], normed[row])
        assert torch.equal(kernels.silu_mul(gate_up[row:row + 1])[0], act[row])


def test_a_tiny_model_matches_the_reference_and_batches_invariantly(isa, tmp_path):
    spec = TinySpec("llama", seed=5)
    path = tmp_path / "tiny.gguf"
    weights = write_tiny_gguf(path, spec)
    engine = Engine(EngineConfig(model_path=path, device="cpu", max_batch=4))
    params = SamplingParams(temperature=0.0, max_tokens=5, top_logprobs=2, ignore_eos=True)
    prompts = [engine.chat_prompt_ids([{"role": "user", "content": text}]) for text in ("hello world", "the", "abc 12")]
    alone = [[r for d in engine.generate({"a": (p, params)})["a"] for r in d.records] for p in prompts]
    together = engine.generate({str(i): (p, params) for i, p in enumerate(prompts)})
    for i, prompt in enumerate(prompts):
        assert [r for d in together[str(i)] for r in d.records] == alone[i]
        ids = [r.token_id for r in alone[i]]
        reference = torch.log_softmax(reference_logits(spec, weights, prompt + ids[:-1]), -1)[len(prompt) - 1:]
        for step, record in enumerate(alone[i]):
            assert abs(record.logprob - float(reference[step, record.token_id])) <= 1e-4


@pytest.mark.parametrize("window", [0, 7])  # 7: a sliding window (gemma3's local layers) that cuts in
@pytest.mark.parametrize("head_dim", [64, 256, 40])  # 64, 256 (gemma3): the vector paths; 40: their scalar fallback
@pytest.mark.parametrize("heads", [6, 8])  # 3 or 4 query heads a KV head: decode runs them 3 and 2 together
def test_prompt_attention_is_decode_attention_row_for_row(isa, head_dim, window, heads):
    """A prompt row attends like a decode step at its position, bit for bit, whatever chunk
    held it: the property the prefix cache stands on."""
    torch.manual_seed(20 + isa)
    kv_heads, max_len, slot = 2, 64, 1
    k_cache, v_cache = torch.randn(3, kv_heads, max_len, head_dim), torch.randn(3, kv_heads, max_len, head_dim)
    q = torch.randn(23, heads, head_dim)
    scale = head_dim ** -0.5
    decoded = kernels.decode_attention(q, k_cache, v_cache, torch.full((23,), slot), torch.arange(1, 24), scale, 2,
                                       window)
    assert torch.equal(kernels.prompt_attention(q, k_cache, v_cache, slot, 0, scale, 2, window), decoded)
    for size in range(1, 6):  # other chunk layouts of the same rows: every row count and start's phase
        for start in range(0, 23, size):
            end = min(start + size, 23)
            chunk = kernels.prompt_attention(q[start:end], k_cache, v_cache, slot, start, scale, 1, window)
            assert torch.equal(chunk, decoded[start:end])
    keys, values = k_cache[slot].double(), v_cache[slot].double()  # [kv_heads, max_len, hd]
    for row in (0, 9, 22):
        first = max(0, row - window + 1) if window else 0
        group = q[row].double().unflatten(0, (kv_heads, -1))
        weights = torch.softmax(group @ keys[:, first:row + 1].transpose(-1, -2) * scale, -1)
        expected = (weights @ values[:, first:row + 1]).flatten(0, 1)
        assert torch.allclose(decoded[row].double(), expected, atol=1e-5)


def test_gelu_tanh_mul_per_row(isa):
    torch.manual_seed(30 + isa)
    gate_up = torch.randn(5, 2 * 37) * 4
    gate_up[0, :3] = torch.tensor([-1e4, 1e4, 0.0])  # the tails: exp clamped, no NaN
    act = kernels.gelu_tanh_mul(gate_up)
    gate, up = gate_up[:, :37].double(), gate_up[:, 37:].double()
    expected = torch.nn.functional.gelu(gate, approximate="tanh") * up
    assert torch.allclose(act.double(), expected, rtol=1e-5, atol=1e-6)
    for row in range(5):
        assert torch.equal(kernels.gelu_tanh_mul(gate_up[row:row + 1])[0], act[row])


def test_gated_rows_split_between_threads(isa):
    """A prefill's activations run on every thread (rows split between them): each element's
    bits are those of its row alone on one thread."""
    torch.manual_seed(40 + isa)
    gate_up = torch.randn(301, 2 * 97) * 4  # enough elements for the split
    for kernel in (kernels.silu_mul, kernels.gelu_tanh_mul):
        together = kernel(gate_up, 2)
        assert torch.equal(together, kernel(gate_up, 1))
        for row in (0, 150, 151, 300):
            assert torch.equal(kernel(gate_up[row:row + 1], 1)[0], together[row])


def first_max_reference(row: list[float]) -> int:
    """The first entry that beats every earlier one (NaN never, -inf never): -1 if none."""
    best, at = float("-inf"), -1
    for j, v in enumerate(row):
        if v > best:
            best, at = v, j
    return at


def test_first_max_is_the_first_maximum_at_every_position(isa):
    """Long rows, so the vector passes run (not only their scalar tails): the maximum in every
    lane and at the tail, ties (the first wins), +0 before -0 and -0 before +0, NaN beside the
    maximum, +inf, rows of only -inf and NaN (-1)."""
    gen = torch.Generator().manual_seed(7)
    rows = []
    for length in (1, 7, 8, 9, 31, 32, 33, 1000, 1031):
        for at in sorted({0, 1, 7, 8, 31, length // 2, length - 2, length - 1}):
            if not 0 <= at < length:
                continue
            row = torch.randn(length, generator=gen) - 10
            row[at] = 5.0
            rows.append(row.clone())
            row[length - 1] = 5.0  # a tie: the first still wins
            rows.append(row.clone())
            row[:] = torch.where(torch.arange(length) % 3 == 0, float("nan"), -1.0)
            row[at] = 0.0
            row[-1 if at != length - 1 else 0] = -0.0  # +0 and -0 compare equal: the first wins
            rows.append(row.clone())
            row[at] = -0.0
            rows.append(row.clone())
            row[at] = float("inf")
            rows.append(row.clone())
        rows.append(torch.full((length,), float("-inf")))
        rows.append(torch.where(torch.arange(length) % 2 == 0, float("nan"), float("-inf")))
    for row in rows:
        assert int(kernels.first_max(row[None])[0]) == first_max_reference(row.tolist()), row


def test_bp_pick_is_the_one_way_a_kernel_picks_its_path():
    """No target_clones or ifunc: their resolver asks the CPU, never the cap, so the levels
    above could not run the portable code on a vector CPU (and GCC exports the resolver)."""
    sources = sorted(CSRC.glob("*.[ch]"))
    assert len(sources) > 10
    for source in sources:
        code = re.sub(r"/\*.*?\*/", "", source.read_text(), flags=re.S)  # comments may name them
        assert not re.search(r"target_clones|\bifunc\b", code), source.name
    assert sum("BP_PICK(" in source.read_text() for source in sources) >= 5


def test_a_twin_per_instruction_set_keeps_every_c_file_short():
    """ggml's way: one name, a file per instruction set (quant_tiles_avx2.c, ..._avx512.c), so
    no C file passes ~300 lines."""
    lengths = {source.name: len(source.read_text().splitlines()) for source in CSRC.glob("*.c")}
    assert {name: n for name, n in lengths.items() if n > 300} == {}
    assert not list(CSRC.parent.glob("*.[ch]")), "the C sources live in ops/csrc/"
    assert {"quant_tiles_avx2.c", "quant_tiles_avx512.c", "quant_dequant_avx2.c"} <= set(lengths)
