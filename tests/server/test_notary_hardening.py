"""POST /v1/verify_rollouts against hostile and unlucky input (issue 58): every list counted
before it is parsed (3,000,000 TIS caps are a 400, not a 149 MiB report) and the report bounded
by --max-logprob-entries; any number JSON can carry scored (vLLM's -9999 clamps) or a 400 naming
its field (1e400, 10**400, NaN, a "²" key), never a 500; an abort while it runs ends in a 200
report that marks the rollouts it cut, and a client that leaves aborts them with no report built;
and the report names the weights that scored it, not those a drain-mode swap installed as the
scoring ended."""

import asyncio
import json
import threading

import httpx
import pytest

from batchproof.engine.model.known_models import resolve_model
from batchproof.engine.outputs import RequestOutput
from batchproof.engine.sampling.logprobs import TokenRecord, TopEntry
from batchproof.notary.records import Rollout
from batchproof.server.errors import APIError
from batchproof.server.trainer import verify_rollouts
from batchproof.server.trainer.verify_rollouts import scored, weights_that_scored
from tests.helpers.http import wait_until
from tests.helpers.live_server import live_server
from tests.server import test_weight_versions

PATH = "/v1/verify_rollouts"
KEY = "notary-key"
AUTH = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
MAX_ENTRIES = 2000  # a few hundred completion tokens: small enough to pass with no scoring
GOOD = {"prompt_token_ids": [1, 2, 3], "completion_token_ids": [4, 5, 6], "logprobs": [-1.0, -2.0, -3.0]}
weights = test_weight_versions.weights  # the fixture: a weights root with new.gguf, the default model's shapes


@pytest.fixture(scope="module")
def live(engine, weights):
    with live_server(engine, allow_weight_updates=True, admin_api_key=KEY, weights_root=weights,
                     max_logprob_entries=MAX_ENTRIES) as live:
        yield live
    if engine.model_path != resolve_model(None) or engine.weight_version != engine.model_sha256[:16]:
        engine.install_weights(engine.prepare_weights(resolve_model(None)))  # idle now: back to the default


def _post(live, path: str, body: bytes | str | dict | None = None, **params) -> httpx.Response:
    content = body.encode() if isinstance(body, str) else body
    if isinstance(body, dict):
        return httpx.post(live.url + path, json=body, params=params, headers=AUTH, timeout=120)
    return httpx.post(live.url + path, content=content, params=params, headers=AUTH, timeout=120)


def _refused(reply: httpx.Response, param: str) -> str:
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param, error
    return error["message"]


def _with_caps(num: int) -> str:
    return '{"rollouts": [' + json.dumps(GOOD) + '], "tis_caps": [' + ",".join(["1"] * num) + "]}"


def test_tis_caps_past_their_limit_are_refused_before_they_are_parsed(live):
    # 3,000,000 (5.7 MiB): past the JSON budget every route counts on the raw bytes
    reply = _post(live, PATH, _with_caps(3_000_000))
    assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_request_error", reply.text
    # 100,000 fit that budget: counted on the decoded JSON, before validation, and named
    assert "100000" in _refused(_post(live, PATH, _with_caps(100_000)), "tis_caps")
    assert "65 numbers" in _refused(_post(live, PATH, _with_caps(65)), "tis_caps")


def test_a_report_past_max_logprob_entries_is_refused_before_it_is_scored(live):
    long = {"prompt_token_ids": [1], "completion_token_ids": [7] * 200, "logprobs": [-1.0] * 200}
    message = _refused(_post(live, PATH, {"rollouts": [long, long]}), "rollouts")
    assert "--max-logprob-entries" in message and str(MAX_ENTRIES) in message
    assert "characters" in _refused(_post(live, PATH, {"rollouts": [{**GOOD, "id": "x" * 10_000}]}), "rollouts[0].id")
    row = {str(i): -1.0 for i in range(100)}
    message = _refused(_post(live, PATH, {"rollouts": [{**GOOD, "top_logprobs": [row, None, None]}]}),
                       "rollouts[0].top_logprobs")
    assert "--max-logprobs" in message


def test_vllms_minus_9999_clamps_are_scored(live):
    reply = _post(live, PATH, {"rollouts": [{**GOOD, "logprobs": [-9999, -9999, -9999]}]})
    assert reply.status_code == 200, reply.text
    report = reply.json()
    assert report["finish_reason"] == "stop" and report["summary"]["num_tokens"] == 3
    assert report["summary"]["mean_abs_diff"] > 9900 and report["summary"]["k3_kl"] > 1e307
    assert report["frameworks"]["trl"]["sampling/importance_sampling_ratio/mean"] > 1e307


BIG = "1" + "0" * 400  # 10**400: an int no float holds


def _body(claim: str = "-1", top: str = "", settings: str = "") -> str:
    """A request's JSON as written: numbers Python's json would not write (1e400, NaN, 10**400)."""
    record = '{"prompt_token_ids": [1, 2], "completion_token_ids": [3, 4], "logprobs": [-1, ' + claim + "]" + top + "}"
    return '{"rollouts": [' + record + "]" + settings + "}"


@pytest.mark.parametrize(("body", "param", "says"), [
    (_body(settings=', "near_tie": 1e400'), "near_tie", "inf"),
    (_body(settings=', "near_tie": ' + BIG), "near_tie", "1000"),
    (_body(settings=', "near_tie": NaN'), "near_tie", "nan"),
    (_body(settings=', "near_tie": -1'), "near_tie", ">= 0"),
    (_body(settings=', "tis_caps": [2, 1e400]'), "tis_caps", "tis_caps[1]"),
    (_body(settings=', "mask_band": [0.5, 1e400]'), "mask_band", "mask_band[1]"),
    (_body(claim="-" + BIG), "rollouts[0].logprobs", "logprobs[1]"),
    (_body(claim="-1e400"), "rollouts[0].logprobs", "logprobs[1]"),
    (_body(top=', "top_logprobs": [{"\\u00b2": -1}, null]'), "rollouts[0].top_logprobs", "'²'"),
])
def test_a_number_no_float_holds_is_a_400_naming_its_field(live, body, param, says):
    assert says in _refused(_post(live, PATH, body), param)


@pytest.mark.parametrize("how", ["abort_requests", "pause_abort"])
def test_an_abort_while_it_runs_is_a_report_marking_the_rollouts_it_cut(live, how):
    assert _post(live, "/pause", mode="keep").status_code == 200  # held where it is: the abort finds it waiting
    try:
        result = {}
        sender = threading.Thread(target=lambda: result.update(reply=_post(live, PATH, {"rollouts": [GOOD] * 2})))
        sender.start()
        assert wait_until(lambda: live.state.backend.num_waiting == 2, timeout=10)
        if how == "abort_requests":
            assert _post(live, "/abort_requests").json() == {"num_aborted": 2}
        else:
            assert _post(live, "/pause", mode="abort").json()["num_aborted"] == 2
        sender.join(30)
    finally:
        _post(live, "/resume")
    reply = result["reply"]
    assert reply.status_code == 200, reply.text
    report = reply.json()
    assert report["finish_reason"] == "abort" and report["summary"]["num_aborted_rollouts"] == 2
    assert report["aborted"] == [{"where": f"rollouts[{i}]", "rollout_id": None, "finish_reason": "abort"}
                                 for i in range(2)]
    assert report["summary"]["num_rollouts"] == 0 and report["rollouts"] == []


def test_a_client_that_leaves_aborts_its_rollouts_and_no_report_is_built(live, monkeypatch):
    built = []
    monkeypatch.setattr(verify_rollouts, "report", lambda *args: built.append(args))
    assert _post(live, "/pause", mode="keep").status_code == 200  # held: the client leaves first
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(live.url + PATH, json={"rollouts": [GOOD] * 2}, headers=AUTH, timeout=1.0)
        assert wait_until(lambda: live.state.backend.num_waiting == 0, timeout=10)
    finally:
        _post(live, "/resume")
    assert built == []


def _record(token_id: int, logprob: float) -> TokenRecord:
    return TokenRecord(0, token_id, logprob, (TopEntry(token_id, 0.0, logprob), TopEntry(9, 0.0, logprob - 1)))


def test_the_rollouts_scored_before_an_abort_keep_their_scores():
    rollouts = [Rollout(f"rollouts[{i}]", [1], [2], [-0.5]) for i in range(2)]
    done = RequestOutput("v-0", "", [], 2, 0, finish_reason="length", weight_version="w1",
                         prompt_records=[None, _record(2, -0.5)])
    cut = RequestOutput("v-1", "", [], 2, 0, finish_reason="abort", weight_version="w1")
    kept, scores, aborted, versions = scored(rollouts, {0: [done], 1: [cut]})
    assert kept == rollouts[:1] and scores[0].logprobs == [-0.5] and aborted == rollouts[1:]
    assert versions == {"w1"}


def test_scores_from_two_weights_or_from_weights_no_longer_named_are_a_503():
    served = [{"model_sha256": "a" * 64, "weight_version": "w1"}, {"model_sha256": "b" * 64, "weight_version": "w2"}]
    assert weights_that_scored({"w2"}, served)["model_sha256"] == "b" * 64
    assert weights_that_scored(set(), served)["model_sha256"] == "a" * 64  # every rollout aborted: the weights asked
    for versions in ({"w1", "w2"}, {"w3"}):  # a keep-mode swap mid-request; two swaps meanwhile
        with pytest.raises(APIError) as caught:
            weights_that_scored(versions, served)
        assert caught.value.status == 503 and caught.value.code == "weights_changed"


def _own_rollouts(live, num: int) -> list[dict]:
    """Greedy completions with their logprobs: claims our scoring repeats exactly."""
    prompts = [f"Story {i}: the tide came in over the grey stones" for i in range(num)]
    reply = _post(live, "/v1/completions", {"prompt": prompts, "max_tokens": 6, "temperature": 0, "logprobs": 0,
                                            "ignore_eos": True, "return_token_ids": True})
    assert reply.status_code == 200, reply.text
    return [{"prompt_token_ids": c["prompt_token_ids"], "completion_token_ids": c["token_ids"],
             "logprobs": c["logprobs"]["token_logprobs"]} for c in reply.json()["choices"]]


def test_the_report_names_the_weights_that_scored_it_across_a_drain_swap(live, engine, monkeypatch):
    records = _own_rollouts(live, 2)
    old = httpx.get(live.url + "/weight_info", headers=AUTH).json()
    scoring_done = threading.Event()
    collect = verify_rollouts.collect_choices

    async def collect_then_swap(*args):
        """The race made certain: the scores are in, and a drain-mode swap installs before the route goes on."""
        by_choice = await collect(*args)
        scoring_done.set()
        for _ in range(3000):  # (30 s at most)
            if engine.weight_version != old["weight_version"]:
                break
            await asyncio.sleep(0.01)
        return by_choice

    monkeypatch.setattr(verify_rollouts, "collect_choices", collect_then_swap)
    result = {}
    sender = threading.Thread(target=lambda: result.update(reply=_post(live, PATH, {"rollouts": records})))
    sender.start()
    assert scoring_done.wait(60)
    swap = _post(live, "/v1/load_weights", {"path": "new.gguf", "mode": "drain"})
    assert swap.status_code == 200, swap.text
    sender.join(60)
    assert swap.json()["model_sha256"] != old["model_sha256"]
    reply = result["reply"]
    assert reply.status_code == 200, reply.text
    report = reply.json()
    assert report["summary"]["all_exact"]  # the old weights' scores: the claims are theirs, bit for bit
    assert report["engine"]["model_sha256"] == old["model_sha256"]
    assert report["engine"]["numerics_id"] == old["numerics_id"]
    assert report["engine"]["weight_version"] == old["weight_version"]
