"""Routing receipts (docs/moe.md): the experts each fed position was routed to, on a request's
last output, [prompt + reply - 1 positions, MoE layers, k]. Two routes to one answer: the
receipt equals transformers' float32 routing of the same tokens; and it is the same alone, in a
mixed batch, in prefill chunks of 7, with speculative decoding, and beside a warm prefix cache."""

import numpy as np
import pytest

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.sampling.params import SamplingParams
from tests.engine.moe_checkpoints import MOE_COMMON, MOE_CONFIGS, reference_routes, write_moe_checkpoint

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, return_routed_experts=True)
SEEDED = SamplingParams(temperature=0.9, seed=3, max_tokens=40, ignore_eos=True, return_routed_experts=True)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe-routes")
    return {name: write_moe_checkpoint(name, root / name) for name in MOE_CONFIGS}


def engine_on(path, **settings) -> Engine:
    return Engine(EngineConfig(model_path=path, device="cpu", max_batch=8, num_threads=1,
                               **({"speculative": False, "prefix_cache": False} | settings)))


def _requests() -> dict[str, tuple[list[int], SamplingParams]]:
    """Five prompts sharing a 36-token prefix that repeats itself (so prompt lookup drafts),
    greedy and seeded by turns; one asks for no receipt."""
    rng = np.random.default_rng(7)
    motif = rng.integers(0, 256, 12).tolist()
    shared = motif * 3
    made = {f"r{i}": (shared + rng.integers(0, 256, n).tolist(), GREEDY if i % 2 else SEEDED)
            for i, n in enumerate((2, 19, 7, 33))}
    made["plain"] = (shared + [5, 6], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    return made


def receipts(engine: Engine, requests: dict, drafts: list | None = None
             ) -> dict[str, tuple[list[int], np.ndarray | None]]:
    """Each request's reply ids and its receipt (and, into `drafts`, (drafted, accepted) each)."""
    out = engine.generate(requests)
    if drafts is not None:
        drafts += [(deltas[-1].num_draft_tokens, deltas[-1].num_accepted_tokens) for deltas in out.values()]
    return {rid: ([t for d in deltas for t in d.token_ids], deltas[-1].routed_experts) for rid, deltas in out.items()}


def check_same(got: dict, alone: dict, requests: dict, label: str) -> None:
    for rid, (ids, routes) in got.items():
        assert ids == alone[rid][0], f"{rid} {label}: tokens"
        if routes is None:
            assert alone[rid][1] is None
            continue
        assert routes.shape[0] == len(requests[rid][0]) + len(ids) - 1
        assert np.array_equal(routes, alone[rid][1]), f"{rid} {label}: routes"


@pytest.mark.parametrize("name", list(MOE_CONFIGS))
def test_the_receipt_is_transformers_routing_of_every_fed_position(name, checkpoints):
    engine = engine_on(checkpoints[name])
    prompt = list(range(40, 61))
    reply, got = receipts(engine, {"a": (prompt, GREEDY)})["a"]
    fed = prompt + reply[:-1]  # the last chosen token is never fed: it has no routing (as vLLM)
    theirs = np.stack([r.numpy() for r in reference_routes(checkpoints[name], fed)], axis=1)
    assert got.dtype == np.uint8  # at most 256 experts
    assert got.shape == (len(fed), theirs.shape[1], MOE_COMMON["num_experts_per_tok"])
    assert np.array_equal(got, theirs)


@pytest.mark.parametrize("name", ["qwen3moe", "mixtral"])
def test_alone_equals_batched_chunked_speculative_and_beside_a_warm_cache(name, checkpoints):
    path, requests = checkpoints[name], _requests()
    cold = engine_on(path)
    alone = {rid: receipts(cold, {rid: request})[rid] for rid, request in requests.items()}
    assert alone["plain"][1] is None  # not asked for: none recorded
    warm = engine_on(path, prefix_cache=True)
    receipts(warm, {"warmer": requests["r3"]})  # its blocks cached with their routes: the receipts reuse them
    for label, engine in [("batched", cold), ("chunked", engine_on(path, max_prefill_tokens=7)), ("warm cache", warm)]:
        check_same(receipts(engine, requests), alone, requests, f"{name} {label}")
    # Alone, where drafts pay for their rows: some accepted, some rejected (their routes cut off).
    speculative, drafts = engine_on(path, speculative=True), []
    for rid, request in requests.items():
        check_same(receipts(speculative, {rid: request}, drafts), alone, requests, f"{name} speculative")
    assert sum(a for _, a in drafts) > 0 and sum(d - a for d, a in drafts) > 0, drafts


def test_a_routing_receipt_reads_the_prefix_cache_only_where_blocks_kept_their_routes(checkpoints):
    """Blocks a plain request left hold no routes: a request asking for its routing computes its
    prompt (none of it cached), and the blocks learn the routes; the next one reuses them. Every
    receipt equals the request's alone on a cold engine, bit for bit."""
    path, requests = checkpoints["olmoe"], _requests()
    prompt = requests["r3"][0]
    asking = {"a": (prompt + [9, 8, 7], GREEDY), "b": (prompt + [1, 2], SEEDED)}
    cold = engine_on(path)
    alone = {rid: receipts(cold, {rid: request})[rid] for rid, request in asking.items()}
    warm = engine_on(path, prefix_cache=True)
    warm.generate({"plain": (prompt, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))})

    def run(rid: str) -> int:
        out = warm.generate({rid: asking[rid]})[rid]
        check_same({rid: ([t for d in out for t in d.token_ids], out[-1].routed_experts)}, alone, asking,
                   f"olmoe {rid}")
        return out[-1].num_cached_tokens

    assert run("a") == 0  # the plain request's blocks have no routes
    assert run("b") >= 32  # "a" gave them theirs: whole blocks of the shared prompt reused


def test_a_dense_model_refuses_it_naming_the_field(checkpoints, tmp_path):
    from tests.hf.checkpoints import tiny_model, write_checkpoint

    dense = engine_on(write_checkpoint(tiny_model("qwen3"), tmp_path / "dense", "qwen3"))
    with pytest.raises(ValueError, match="return_routed_experts"):
        dense.add_request("x", [1, 2, 3], GREEDY)
