"""The compiled backend's tail logprob (logprobs.c, bp_tail_logprobs_f32): the normaliser's own terms
with the shown ones zeroed, in its order and log, so the same bits at every instruction set and
on every host. Two routes each: the kernel's tail against the torch formula (close: two
numerics), against the kernel's own normaliser of the row with the shown ids removed (equal
bits), alone against batched, and at every ISA cap against the others."""

import hashlib
import math

import pytest
import torch

from batchproof.engine.model.ops import KernelOps, TorchOps, kernels
from batchproof.engine.sampling import logprobs
from batchproof.engine.sampling.logprobs import build_records

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the kernels are not built here")
LEVELS = [level for level in (2, 1, 0) if kernels.available() and level <= kernels.isa_level()]
INF, NAN = float("inf"), float("nan")

# SHA-256 of fingerprint()'s bits under each numerics version: a change to the tail's arithmetic
# (the normaliser's exp, its lane order, its log) fails this until NUMERICS_VERSION (isa.c) is
# bumped and the new digest recorded here. Recorded on an AVX2 host; each level checks itself.
TAIL_DIGESTS = {
    "fixed-order-w8-v2": "a2bb842ef44dd7975be4cd466f0c311888c2e95baf9bff7b1d48d0369a116d5c",
}


def kernel_tails(logits: torch.Tensor, k: int, top_ns: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(top ids, tails) on KernelOps' route, each row showing min(top_n, its count) as build_records does."""
    ops = KernelOps(num_threads=1)
    norm, top = ops.normalizer_and_top_k(logits, k)
    return top.ids, ops.tail_logprobs(norm, top.ids, torch.minimum(torch.tensor(top_ns), top.counts))


def torch_tails(logits: torch.Tensor, k: int, top_ns: list[int]) -> torch.Tensor:
    norm, top = logprobs.normalizer_and_top_k(logits, k)
    return TorchOps(padded=True).tail_logprobs(norm, top.ids, torch.minimum(torch.tensor(top_ns), top.counts))


def pseudo_random(n: int, seed: int) -> torch.Tensor:
    """n floats in [-4, 4) from an integer hash, each exact in float32: the same inputs under any torch."""
    i = torch.arange(n, dtype=torch.int64) + seed * 1_000_003
    h = (i * 2654435761 + 12345) % 2**32
    h = (h ^ (h >> 15)) * 2246822519 % 2**32
    return ((h >> 8).to(torch.float32) - 2**23) / 2**21


def special_rows(vocab: int) -> torch.Tensor:
    """Rows that take the normaliser's other branches: NaNs, -infs, two +infs, all NaN, one finite."""
    rows = pseudo_random(6 * vocab, 3).view(6, vocab) * 3
    rows[0, ::7] = NAN
    rows[1, 1::3] = -INF
    rows[2, [5, 40]] = INF
    rows[3] = NAN
    rows[4] = -INF
    rows[4, 17] = 2.5
    rows[5, :vocab - 2] = NAN  # two candidates for a top of 4: the ids past the count repeat
    return rows


def test_the_kernel_tail_is_the_torch_formula_within_the_normalisers_tolerance(isa):
    """Different exps (exp_poly against torch's), so close, not equal: the tolerance of the
    kernel's normaliser against torch's (test_logprobs.py)."""
    torch.manual_seed(0)
    logits = torch.cat([torch.randn(5, 4099) * 4, special_rows(4099)])
    top_ns = [0, 1, 3, 5, 5, 5, 5, 1, 5, 1, 5]
    _, got = kernel_tails(logits, 5, top_ns)
    want = torch_tails(logits, 5, top_ns)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True), (got, want)
    assert got[0].item() == 0.0 and got[8].item() == 0.0  # nothing shown: the whole mass, exactly
    assert math.isclose(got[7].item(), -math.log(2), rel_tol=1e-6)  # one +inf of two shown: half the mass
    assert got[9].item() == -INF and got[10].item() == -INF  # every candidate shown: nothing outside


def test_the_outside_sum_is_the_terms_sum_to_floats_rounding(isa):
    """The mass outside is summed in double in the normaliser's lanes, so tail + log_total is the
    log of the exact sum of the kept terms within a few float ulps (the exp terms' own error), on
    Gemma 3's vocabulary with a peaked row, and an id shown twice removes one term."""
    vocab = 262_147  # Gemma 3's vocabulary, and a 3-entry remainder past the 8 lanes
    logits = pseudo_random(3 * vocab, 5).view(3, vocab) * 4
    logits[:, 100] = 30.0  # every row's max
    logits[2, 7] = 29.0
    ids = torch.tensor([[100, 8, 262_146, 9], [100, 1, 2, 3], [100, 7, 7, 11]])
    num_shown = torch.tensor([3, 1, 4])
    _, _, row_max, log_total, _ = kernels.top_k_logprobs(logits, 0)
    tails = kernels.tail_logprobs(logits, row_max, log_total, ids, num_shown)
    for r in range(3):
        kept = torch.ones(vocab, dtype=torch.bool)
        kept[ids[r, :num_shown[r]]] = False
        exact = math.log(math.fsum(torch.exp(logits[r, kept].double() - 30.0).tolist()))
        assert math.isclose(tails[r].item() + log_total[r].item(), exact, abs_tol=4e-7), r


def test_a_narrower_top_moves_its_entry_into_the_tail():
    """The server's echo check, tighter: the tail with one entry shown holds the second entry and
    the tail with two shown (float lanes over 49,152 logits missed this by 1.2e-5)."""
    logits = pseudo_random(4 * 49_152, 13).view(4, 49_152) * 2
    logits[:, 3] += 14.0  # peaked, as a language model's rows
    logits[:, 9] += 12.0
    ops = KernelOps(num_threads=1)
    norm, top = ops.normalizer_and_top_k(logits, 2)
    one = ops.tail_logprobs(norm, top.ids, torch.ones(4, dtype=torch.int64)).double()
    two = ops.tail_logprobs(norm, top.ids, torch.full((4,), 2)).double()
    second = top.logprobs[:, 1].double()
    assert torch.allclose(one.exp(), second.exp() + two.exp(), rtol=2e-7, atol=0)


def test_a_row_has_the_same_tail_bits_alone_and_batched(isa):
    torch.manual_seed(1)
    logits = torch.cat([torch.randn(4, 5003) * 3, special_rows(5003)])
    top_ns = [4, 1, 0, 2, 4, 4, 0, 4, 4, 4]
    _, batched = kernel_tails(logits, 4, top_ns)
    for r in range(logits.shape[0]):
        _, alone = kernel_tails(logits[r:r + 1], 4, top_ns[r:r + 1])
        assert alone.view(torch.int32).tolist() == batched[r:r + 1].view(torch.int32).tolist()


def test_every_instruction_set_gives_the_same_tail_bits():
    """The cap changes which exp-sum runs (AVX2's 8-lane registers or the portable lanes), never a bit."""
    logits = torch.cat([pseudo_random(4 * 262_145, 7).view(4, 262_145) * 5, special_rows(262_145)])
    top_ns = [20, 1, 7, 0, 20, 20, 3, 20, 20, 20]
    seen = {}
    for level in LEVELS:
        kernels.cap_isa_level(level)
        try:
            seen[kernels.ISA_NAMES[level]] = kernel_tails(logits, 20, top_ns)[1].view(torch.int32).tolist()
        finally:
            kernels.cap_isa_level(2)
    assert len(set(map(tuple, seen.values()))) == 1, seen


def test_repeated_ids_are_removed_once_and_ids_past_the_count_not_at_all():
    """A row with fewer candidates than k repeats its last id past its count; an id named twice
    within the count is still one term gone (as the torch formula's counted hits)."""
    logits = torch.tensor([[1.0, NAN, 1.0, NAN, 0.5]])
    norm, top = KernelOps(num_threads=1).normalizer_and_top_k(logits, 5)
    assert top.counts.tolist() == [3] and top.ids[0, :3].tolist() == [0, 2, 4]
    ops = KernelOps(num_threads=1)
    once = ops.tail_logprobs(norm, torch.tensor([[0, 4, 4, 4, 4]]), torch.tensor([2]))
    twice = ops.tail_logprobs(norm, torch.tensor([[0, 0, 4, 4, 4]]), torch.tensor([2]))
    alone = ops.tail_logprobs(norm, torch.tensor([[0, 2, 3, 3, 3]]), torch.tensor([1]))
    assert twice.item() == alone.item()  # id 0 named twice: only its term gone
    reference = logprobs.tail_logprobs(norm, torch.tensor([[0, 0, 4, 4, 4]]), torch.tensor([2]))
    assert math.isclose(twice.item(), reference.item(), rel_tol=1e-6)
    assert math.isclose(once.item(), math.log(math.e ** 1.0) - math.log(2 * math.e + math.e ** 0.5), rel_tol=1e-6)
    assert ops.tail_logprobs(norm, top.ids, torch.tensor([3])).item() == -INF


def test_bad_ids_and_counts_are_refused_by_name():
    logits = torch.randn(2, 10)
    norm, top = KernelOps(num_threads=1).normalizer_and_top_k(logits, 2)
    ops = KernelOps(num_threads=1)
    with pytest.raises(ValueError, match="top_ids entry is outside the vocabulary"):
        ops.tail_logprobs(norm, torch.tensor([[0, 10], [1, 2]]), torch.tensor([2, 1]))
    with pytest.raises(ValueError, match="num_shown"):
        ops.tail_logprobs(norm, top.ids, torch.tensor([3, 0]))
    ops.tail_logprobs(norm, torch.tensor([[0, 10], [1, 2]]), torch.tensor([1, 1]))  # past the count: unread


def test_records_on_the_kernels_take_the_kernel_tail_never_torchs(monkeypatch):
    """build_records asks the normaliser for the tail, and the kernels' normaliser carries theirs:
    with the torch formula made to fail, records on KernelOps still get their tails, and they are
    the kernel's bits; the torch backend's records still take the torch formula."""
    torch.manual_seed(2)
    logits = torch.randn(3, 3001) * 4
    ops = KernelOps(num_threads=1)
    calls = []
    reference = logprobs.tail_logprobs
    monkeypatch.setattr(logprobs, "tail_logprobs", lambda *args: calls.append(1) or reference(*args))
    records = build_records(logits, [0, 1, 2], [3, 0, 5], [0, 0, 0], ops.normalizer_and_top_k,
                            with_tails=[True, True, True])
    assert calls == []
    ids, tails = kernel_tails(logits, 5, [3, 0, 5])
    assert [r.tail for r in records] == tails.tolist()
    assert records[1].tail == 0.0
    build_records(logits, [0], [3], [0], logprobs.normalizer_and_top_k, with_tails=[True])
    assert calls == [1]


def fingerprint() -> bytes:
    vocab = 49_157
    logits = torch.cat([pseudo_random(3 * vocab, 11).view(3, vocab) * 6, special_rows(vocab)])
    return kernel_tails(logits, 20, [20, 5, 1, 20, 20, 3, 0, 20, 20])[1].numpy().tobytes()


@pytest.mark.parametrize("level", [2, 1, 0], ids=lambda level: {2: "avx512", 1: "avx2", 0: "portable"}[level])
def test_the_numerics_version_names_the_tail_bits(level):
    if kernels.isa_level() < level:
        pytest.skip("this CPU lacks that level")
    kernels.cap_isa_level(level)
    try:
        digest = hashlib.sha256(fingerprint()).hexdigest()
    finally:
        kernels.cap_isa_level(2)
    version = kernels.numerics_version()
    assert version in TAIL_DIGESTS, f"record the tail digest of numerics {version}: {digest}"
    assert digest == TAIL_DIGESTS[version], f"the tail's bits changed: bump NUMERICS_VERSION (isa.c), got {digest}"
