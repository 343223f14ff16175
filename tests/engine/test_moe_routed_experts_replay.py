"""Routing replay (R3): scoring a sequence under a given routing (SamplingParams.forced_routes).
Forcing the routing the model chose itself changes no bit of any logprob (replay == free
scoring); forcing one expert id changed at one position changes the scores only from the token
that position predicts on; a replayed sequence scores the same alone and beside free ones in one
prefill; and a routing that cannot be this model's is refused naming the field."""

import dataclasses

import numpy as np
import pytest

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.sampling.params import SamplingParams
from tests.engine.moe_checkpoints import write_moe_checkpoint
from tests.hf.checkpoints import as_array

SCORE = SamplingParams(temperature=0, max_tokens=0, prompt_logprobs=2, return_routed_experts=True,
                       cache_namespace=None)


@pytest.fixture(scope="module", params=["qwen3moe", "olmoe"])
def rollout(request, tmp_path_factory):
    """(engine, the tokens of a prompt and a sampled reply, the routing generation chose)."""
    path = write_moe_checkpoint(request.param, tmp_path_factory.mktemp("replay") / request.param)
    engine = Engine(EngineConfig(model_path=path, device="cpu", max_batch=8, num_threads=1, speculative=False,
                                 max_prefill_tokens=16))  # chunks: the claim is cut across prefill steps
    prompt = list(range(30, 55))
    params = SamplingParams(temperature=0.8, seed=2, max_tokens=12, ignore_eos=True, return_routed_experts=True)
    deltas = engine.generate({"g": (prompt, params)})["g"]
    ids = prompt + [t for d in deltas for t in d.token_ids]
    return engine, ids, deltas[-1].routed_experts


def scored(engine: Engine, requests: dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each request's prompt records [targets 1.., entries, (id, logprob)] and the router's own
    routing of it."""
    out = engine.generate(requests)
    return {rid: (np.stack([as_array([r]) for r in deltas[0].prompt_records[1:]]), deltas[-1].routed_experts)
            for rid, deltas in out.items()}


def test_replaying_the_model_s_own_routing_changes_no_bit(rollout):
    engine, ids, routes = rollout
    free, replayed = SCORE, dataclasses.replace(SCORE, forced_routes=routes)
    got = scored(engine, {"free": (ids, free), "replayed": (ids, replayed)})
    assert np.array_equal(got["free"][1], routes)  # scoring routes as generating did
    assert np.array_equal(got["replayed"][0], got["free"][0])
    assert np.array_equal(got["replayed"][1], routes)


def test_one_expert_changed_moves_the_scores_from_the_next_token_on(rollout):
    engine, ids, routes = rollout
    position, layer = 30, 0  # the first MoE layer: every later layer at every later position feels it
    tampered = routes.copy()
    tampered[position, layer, 0] = next(e for e in range(8) if e not in routes[position, layer])
    free = scored(engine, {"free": (ids, SCORE)})["free"]
    alone = scored(engine, {"t": (ids, dataclasses.replace(SCORE, forced_routes=tampered))})["t"]
    # Record i scores token i + 1 from position i: those up to the tampered position are untouched.
    assert np.array_equal(alone[0][:position], free[0][:position])
    assert not np.array_equal(alone[0][position], free[0][position])
    assert not np.array_equal(alone[0][-1], free[0][-1])  # and the last, through attention
    # The router's own choice: the same up to the tampered layer at that position (its input is).
    assert np.array_equal(alone[1][:position], routes[:position])
    assert np.array_equal(alone[1][position, :layer + 1], routes[position, :layer + 1])
    # Beside a free sequence and another replay in one prefill: the same bits.
    replay = {"t": (ids, dataclasses.replace(SCORE, forced_routes=tampered)),
              "own": (ids, dataclasses.replace(SCORE, forced_routes=routes))}
    together = scored(engine, {**replay, "free": (ids[:40], SCORE)})
    assert all(np.array_equal(a, b) for a, b in zip(together["t"], alone))
    assert np.array_equal(together["own"][0], free[0]) and np.array_equal(together["free"][0], free[0][:39])


@pytest.mark.parametrize("change,mentions", [
    (lambda r: r[:, :1], "MoE layers"),
    (lambda r: np.concatenate([r, r[:5]]), "positions"),
    (lambda r: np.where(r == r.max(), 99, r), "expert ids"),
    (lambda r: np.repeat(r[:, :, :1], 2, axis=2), "distinct"),
])
def test_a_routing_that_cannot_be_this_model_s_is_refused(rollout, change, mentions):
    engine, ids, routes = rollout
    with pytest.raises(ValueError, match=f"forced_routes.*{mentions}"):
        engine.add_request("bad", ids, dataclasses.replace(SCORE, forced_routes=change(routes)))


def test_replay_is_for_scoring_outside_the_prefix_cache():
    routes = np.zeros((3, 2, 2), dtype=np.uint8)
    for wrong in ({"max_tokens": 4}, {"cache_namespace": ""}):
        with pytest.raises(ValueError, match="forced_routes"):
            dataclasses.replace(SCORE, forced_routes=routes, **wrong)
