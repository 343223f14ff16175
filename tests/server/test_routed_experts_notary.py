"""The notary reads a rollout's claimed MoE routing (vLLM's `routed_experts`, as our chat route
returned it, or the same as nested lists) and sets it against its own routing of the same
tokens: an honest rollout's matches at every position and layer; one with a single expert id
changed is named at that position and layer, with both expert lists; over HTTP
(/v1/verify_rollouts) and from the command line (`batchproof verify-rollouts`) alike. With
replay_routing each is scored under its claimed routing: the honest one exactly as without,
the tampered one departing from the token its changed position predicts."""

import argparse
import base64
import io
import json

import numpy as np
import openai
import pytest

from batchproof.commands import verify_rollouts
from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from tests.engine.moe_checkpoints import write_moe_checkpoint
from tests.helpers.http import ASCII_PROMPT, assert_error, messages, post
from tests.helpers.live_server import live_server

NUM_EXPERTS = 8  # the tiny qwen3moe's


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    return write_moe_checkpoint("qwen3moe", tmp_path_factory.mktemp("moe-notary") / "qwen3moe")


@pytest.fixture(scope="module")
def moe_server(moe_path):
    engine = Engine(EngineConfig(model_path=moe_path, device="cpu", max_batch=8, num_threads=1))
    with live_server(engine) as live:
        yield live


@pytest.fixture(scope="module")
def rollout(moe_server) -> dict:
    """A sampled reply from the chat route, as a trainer records it: ids, logprobs and routing."""
    client = openai.OpenAI(base_url=moe_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    reply = client.chat.completions.create(
        model=moe_server.state.served_model_name, messages=messages(ASCII_PROMPT), max_tokens=8, temperature=0.8,
        seed=5, logprobs=True,
        extra_body={"return_routed_experts": True, "return_token_ids": True, "ignore_eos": True}).model_dump()
    choice = reply["choices"][0]
    return {"prompt_token_ids": reply["prompt_token_ids"], "completion_token_ids": choice["token_ids"],
            "logprobs": [e["logprob"] for e in choice["logprobs"]["content"]],
            "routed_experts": choice["routed_experts"], "id": "honest"}


def decoded(field: str) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(field)))


def encoded(routes: np.ndarray) -> str:
    buffer = io.BytesIO()
    np.save(buffer, routes)
    return base64.b64encode(buffer.getvalue()).decode()


def tampered(rollout: dict, position: int, layer: int) -> tuple[dict, list[int], list[int]]:
    """The rollout with one expert id at (position, layer) changed to one the row does not hold
    -> it, the honest experts there, and the claimed ones."""
    routes = decoded(rollout["routed_experts"]).copy()
    honest = routes[position, layer].tolist()
    routes[position, layer, 0] = next(e for e in range(NUM_EXPERTS) if e not in honest)
    return {**rollout, "routed_experts": encoded(routes), "id": "tampered"}, honest, routes[position, layer].tolist()


def test_the_notary_matches_an_honest_routing_and_names_a_tampered_one(moe_server, rollout):
    num_prompt = len(rollout["prompt_token_ids"])
    position, layer = num_prompt + 3, 1  # the routing of the reply's fourth token, in the second MoE layer
    lie, honest, claimed = tampered(rollout, position, layer)
    as_lists = {**rollout, "routed_experts": decoded(rollout["routed_experts"]).tolist(), "id": "lists"}
    unclaimed = {k: v for k, v in rollout.items() if k != "routed_experts"} | {"id": "unclaimed"}
    response = post(moe_server.url, "/v1/verify_rollouts", {"rollouts": [rollout, lie, as_lists, unclaimed]})
    assert response.status_code == 200, response.text
    report = response.json()
    by_id = {r["rollout_id"]: r for r in report["rollouts"]}
    assert report["summary"]["all_exact"]  # the logprobs too: the rollout is ours
    assert by_id["honest"]["routing"] == {"matches": True, "num_positions_differing": 0, "first_difference": None}
    assert by_id["lists"]["routing"] == by_id["honest"]["routing"]
    assert "routing" not in by_id["unclaimed"]
    assert by_id["tampered"]["routing"] == {
        "matches": False, "num_positions_differing": 1,
        "first_difference": {"position": position, "completion_index": 3, "layer": layer, "claimed": claimed,
                             "ours": honest}}
    assert report["summary"]["num_routed_rollouts"] == 3 and report["summary"]["num_routing_mismatches"] == 1


def test_the_command_line_names_the_same_tampered_position(moe_path, rollout, tmp_path):
    num_prompt = len(rollout["prompt_token_ids"])
    lie, honest, claimed = tampered(rollout, num_prompt - 2, 0)  # a prompt position this time
    path = tmp_path / "rollouts.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (rollout, lie)) + "\n")
    engine = Engine(EngineConfig(model_path=moe_path, device="cpu", max_batch=8, num_threads=1))
    reports = {}
    for replay in (False, True):
        args = argparse.Namespace(file=path, out=tmp_path / f"out-{replay}", model=None, device="cpu", near_tie=0.05,
                                  tis_cap=None, mask_band=(0.5, 2.0), quiet=True, replay_routing=replay)
        assert verify_rollouts.run(args, engine=engine) == 0
        reports[replay] = json.loads((args.out / "report.json").read_text())
    for report in reports.values():
        honest_gap, lie_gap = report["rollouts"]
        assert honest_gap["routing"]["matches"] and honest_gap["num_exact"] == honest_gap["num_tokens"]
        assert lie_gap["routing"]["first_difference"] == {"position": num_prompt - 2, "completion_index": None,
                                                          "layer": 0, "claimed": claimed, "ours": honest}
    assert reports[False]["summary"]["all_exact"]  # scored under our routing, the claim aside
    assert reports[True]["rollouts"][1]["first_divergent_position"] == 0  # under the claimed: from the first token


def test_replay_scores_under_the_claimed_routing(moe_server, rollout):
    num_prompt = len(rollout["prompt_token_ids"])
    lie, honest, claimed = tampered(rollout, num_prompt + 3, 0)
    response = post(moe_server.url, "/v1/verify_rollouts", {"rollouts": [rollout, lie], "replay_routing": True})
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["settings"]["replay_routing"] is True
    honest_gap, lie_gap = report["rollouts"]
    assert honest_gap["num_exact"] == honest_gap["num_tokens"] and honest_gap["routing"]["matches"]
    # The changed expert at position p moves the logprob of token p + 1: the reply's fifth.
    assert lie_gap["first_divergent_position"] == 4
    assert lie_gap["routing"]["first_difference"] == {"position": num_prompt + 3, "completion_index": 3, "layer": 0,
                                                      "claimed": claimed, "ours": honest}


def test_a_routing_that_cannot_be_replayed_is_a_400_naming_it(moe_server, rollout):
    wide = decoded(rollout["routed_experts"])
    bad = {**rollout, "routed_experts": np.concatenate([wide, wide], axis=2).tolist()}  # 4 experts a token, not 2
    assert_error(post(moe_server.url, "/v1/verify_rollouts", {"rollouts": [bad], "replay_routing": True}), 400,
                 param="rollouts[0].routed_experts", mentions=("cannot be replayed",))


@pytest.mark.parametrize("claim,mentions", [
    (lambda r: decoded(r["routed_experts"])[:-1].tolist(), ("positions",)),  # one position short
    (lambda r: "not base64!", ("base64",)),
    (lambda r: 7, ("base64 .npy string",)),
])
def test_a_bad_claim_is_a_400_naming_it(moe_server, rollout, claim, mentions):
    bad = {**rollout, "routed_experts": claim(rollout)}
    assert_error(post(moe_server.url, "/v1/verify_rollouts", {"rollouts": [rollout, bad]}), 400,
                 param="rollouts[1].routed_experts", mentions=mentions)


def test_a_dense_model_refuses_a_claimed_routing(server):
    claim = {"prompt_token_ids": [1, 2, 3], "completion_token_ids": [4], "logprobs": [-1.0],
             "routed_experts": [[[0, 1]]] * 3}
    assert_error(post(server.url, "/v1/verify_rollouts", {"rollouts": [claim]}), 400,
                 param="rollouts[0].routed_experts", mentions=("mixture-of-experts",))
