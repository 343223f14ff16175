"""POST /v1/verify_rollouts: the same report the CLI writes for the same records (two routes,
one answer), and a bad record is a 400 naming it and its field."""

import argparse
import json

import pytest

from batchproof.commands import verify_rollouts
from tests.helpers.http import post
from tests.helpers.live_server import live_server
from tests.helpers.rollouts import own_rollouts

PATH = "/v1/verify_rollouts"


def test_http_and_cli_give_one_report(engine, tmp_path):
    with live_server(engine) as live:
        records = own_rollouts(live.url, num_per_prompt=1)
        records[1]["logprobs"] = [v - 0.5 for v in records[1]["logprobs"]]
        reply = post(live.url, PATH, {"rollouts": records})
        assert reply.status_code == 200, reply.text
        over_http = reply.json()
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    args = argparse.Namespace(file=path, out=tmp_path / "out", model=None, device="cpu", near_tie=0.05,
                              tis_cap=None, mask_band=(0.5, 2.0), quiet=True)
    assert verify_rollouts.run(args, engine=engine) == 0
    from_cli = json.loads((tmp_path / "out" / "report.json").read_text())
    for key in ("summary", "frameworks", "importance_ratio", "truncation", "by_position"):
        assert over_http[key] == from_cli[key], key
    strip = [{k: v for k, v in r.items() if k != "where"} for r in over_http["rollouts"]]
    assert strip == [{k: v for k, v in r.items() if k != "where"} for r in from_cli["rollouts"]]
    assert [r["where"] for r in over_http["rollouts"]] == [f"rollouts[{i}]" for i in range(len(records))]
    assert over_http["summary"]["num_divergent_rollouts"] == 1


@pytest.mark.parametrize(("change", "param", "says"), [
    ({"logprobs": [-1.0]}, "rollouts[1].logprobs", "values for"),
    ({"completion_token_ids": [10**9, 1]}, "rollouts[1].completion_token_ids", "1000000000"),
    ({"prompt_token_ids": []}, "rollouts[1].prompt_token_ids", "empty"),
    ({"logprobs": [0.5, -1.0]}, "rollouts[1].logprobs", "0.5"),
    ({"top_logprobs": [{"x": -1.0}, None]}, "rollouts[1].top_logprobs", "'x'"),
    ({"extra": 1}, "rollouts[1].extra", "not a rollout field"),
])
def test_a_bad_record_is_a_400_naming_it(server, change, param, says):
    good = {"prompt_token_ids": [1, 2, 3], "completion_token_ids": [4, 5], "logprobs": [-1.0, -2.0]}
    reply = post(server.url, PATH, {"rollouts": [good, {**good, **change}]})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and says in error["message"] and "rollouts[1]" in error["message"]


def test_an_empty_list_and_a_bad_band(server):
    reply = post(server.url, PATH, {"rollouts": []})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "rollouts"
    good = {"prompt_token_ids": [1, 2], "completion_token_ids": [3], "logprobs": [-1.0]}
    reply = post(server.url, PATH, {"rollouts": [good], "mask_band": [2.0, 3.0]})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "mask_band"
