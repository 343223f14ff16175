"""`batchproof fleet` with 2 replicas of 1 thread on a local Ray instance: the same answers as
`batchproof serve`, bit for bit, from either replica; who served each reply; and what a
replica's death or a client's hang-up does."""

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import yaml

from batchproof.check.contract import shipped_contract_text
from batchproof.cli import main
from batchproof.engine.model.default_model import default_model_path
from tests.helpers.fleet import listeners, running_fleet
from tests.helpers.http import assert_error, chat_body, parse_sse, wait_until
from tests.helpers.probe_matrix import SHORT_MATRIX

pytest.importorskip("ray.serve")

HEADER = "x-batchproof-replica"
PROMPT = "Name three rivers of Europe."
ROUNDS = 6  # of 8 requests at once, until both replicas have answered


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with running_fleet(tmp_path_factory.mktemp("fleet") / "fleet.log") as running:
        yield running


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


def _answer(url: str, stream: bool, max_tokens: int = 12) -> tuple[str, list[tuple]]:
    """(the replica header, every token with its logprob and top-2 alternatives) of one greedy chat reply."""
    client = _client(url)
    raw = client.chat.completions.with_raw_response.create(
        model=client.models.list().data[0].id, messages=[{"role": "user", "content": PROMPT}], max_tokens=max_tokens,
        temperature=0, logprobs=True, top_logprobs=2, stream=stream)
    reply = raw.parse()
    if stream:
        entries = [e for chunk in reply for choice in chunk.choices if choice.logprobs
                   for e in choice.logprobs.content]
    else:
        entries = reply.choices[0].logprobs.content
    return raw.headers.get(HEADER), [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs])
                                     for e in entries]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_every_replica_answers_bitwise_as_the_single_server(fleet, server, stream: bool) -> None:
    _, expected = _answer(server.url, stream)
    assert len(expected) == 12
    alive = {r["id"] for r in fleet.alive_replicas()}
    assert len(alive) == 2
    answers: list[tuple[str, list[tuple]]] = []
    # Which replica takes a request is Ray's router's choice (two random replicas, the shorter
    # queue): on a busy machine one round of 8 has gone all to one replica. Rounds go on until
    # both have answered, so the bitwise comparison below covers each replica.
    for _ in range(ROUNDS):
        with ThreadPoolExecutor(8) as pool:  # at once, so each replica also batches them
            answers += pool.map(lambda _: _answer(fleet.url, stream), range(8))
        if {replica for replica, _ in answers} == alive:
            break
    assert {replica for replica, _ in answers} == alive, f"both replicas get traffic in {ROUNDS} rounds of 8"
    for replica, entries in answers:
        assert entries == expected, f"replica {replica} differs from batchproof serve"


def test_completions_and_prompt_scoring_match(fleet, server) -> None:
    body = {"prompt": "The capital of France is", "max_tokens": 6, "logprobs": 3, "echo": True, "temperature": 0}
    expected = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()["choices"][0]["logprobs"]
    seen = set()
    for _ in range(6):
        reply = httpx.post(f"{fleet.url}/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200
        seen.add(reply.headers[HEADER])
        assert reply.json()["choices"][0]["logprobs"] == expected
    assert seen  # Ray's router may keep a serial client on one replica; the parallel test covers both


def test_errors_are_the_single_servers(fleet, server) -> None:
    for path, body in [("/v1/chat/completions", chat_body("hi", max_tokens=0)),
                       ("/v1/chat/completions", {"messages": []}),
                       ("/v1/completions", {"prompt": [10**9], "max_tokens": 1}),
                       ("/v1/chat/completions", chat_body("hi", model="nope"))]:
        ours, theirs = (httpx.post(f"{url}{path}", json=body, timeout=30) for url in (fleet.url, server.url))
        assert (ours.status_code, ours.json()) == (theirs.status_code, theirs.json())


def test_the_trainer_routes_are_a_501_through_the_router(fleet) -> None:
    """The router's Backend has no WeightControl (each replica holds its own weights and queue):
    what only reads it is a 501 in OpenAI's envelope, as load_weights is (tests/server/test_weight_control.py)."""
    for path in ("/weight_info", "/is_paused"):
        error = assert_error(httpx.get(fleet.url + path, timeout=30), 501, param=None,
                             mentions=(f"{path} runs on a single engine",))
        assert error["type"] == "not_implemented_error"


def test_info_health_and_metrics(fleet, server) -> None:
    info = fleet.info()
    replicas = info["fleet"]["replicas"]
    assert [r["alive"] for r in replicas] == [True, True] and info["fleet"]["numerics_agree"]
    single = httpx.get(f"{server.url}/v1/server_info").json()
    # the same model, weights, dtype, arithmetic and source: the same numerics, so the same bits
    assert {r["numerics_id"] for r in replicas} == {info["numerics_id"]} == {single["numerics_id"]}
    assert all(r["decode_path"] == single["decode_path"] for r in replicas)
    assert httpx.get(f"{fleet.url}/health").status_code == 200
    metrics = httpx.get(f"{fleet.url}/metrics").text
    for replica in replicas:
        assert f'batchproof_batch_size_count{{replica="{replica["id"]}"}}' in metrics


def test_a_local_fleet_listens_on_loopback_only(fleet) -> None:
    """Ray's APIs run code for whoever reaches them: on one machine, no Ray process (GCS, raylet,
    agents, controller, replicas) may listen beyond loopback; 0.0.0.0 and :: count as beyond."""
    # The walk must see Ray's processes, or an empty list would pass. A walk over /proc can
    # miss a process whose files it reads as they change: a few tries.
    ray_processes = ("gcs_server", "raylet", "ray::DashboardAgent", "ray::ServeReplica")
    for _ in range(10):
        found = listeners(fleet.process.pid)
        commands = " ".join(listener.command for listener in found)
        if all(name in commands for name in ray_processes):
            break
        time.sleep(1)
    for ray_process in ray_processes:
        assert ray_process in commands, f"no listener of {ray_process} in the fleet's process tree"
    assert any(listener.port == int(fleet.url.rsplit(":", 1)[1]) for listener in found), "the ingress"
    outside = [str(listener) for listener in found if not listener.is_loopback]
    assert not outside, "listening beyond loopback:\n" + "\n".join(outside)


def test_probe_fleet_passes_and_the_witness_is_admissible(fleet, tmp_path, capsys) -> None:
    matrix, witness_path, contract = tmp_path / "matrix.yaml", tmp_path / "witness.json", tmp_path / "contract.yaml"
    matrix.write_text(SHORT_MATRIX)
    code = main(["probe", "--url", fleet.url, "--fleet", "--matrix", str(matrix), "--witness", str(witness_path),
                 "--model-file", str(default_model_path()), "--host", "test-host", "--commit", "0" * 40,
                 "--binary-sha256", fleet.info()["build_sha256"], "--settle", "5"])
    witness = json.loads(witness_path.read_text())
    assert code == 0, capsys.readouterr()
    replicas = {r["id"] for r in fleet.alive_replicas()}
    assert witness["result"] == "PASS"
    section = witness["fleet"]
    assert section["result"] == "PASS" and section["divergence"] is None and section["pairs_diverged"] == 0
    assert {r["id"] for r in section["replicas"]} == replicas and section["pairs_compared"] >= 1
    slots = [slot for band in witness["bands"] for slot in band["slots"]]
    assert slots and all(slot["replica"] in replicas for slot in slots), "every slot's replica recorded"
    # S7's ratio is 0 here: the test asks that both rates were measured, never how fast they were.
    raw = yaml.safe_load(shipped_contract_text()) | {"bands": [1, 4, 8], "declared_min_floor": 16,
                                                     "decode_ratio_c4_over_c1": 0.0}
    contract.write_text(yaml.safe_dump(raw))
    capsys.readouterr()
    assert main(["check", str(witness_path), "--contract", str(contract)]) == 0, capsys.readouterr().out
    assert capsys.readouterr().out.strip().endswith(": ADMISSIBLE")


def _running(fleet) -> int:
    return sum(r["num_running"] for r in fleet.alive_replicas())


def test_a_client_that_hangs_up_frees_its_slot(fleet) -> None:
    body = chat_body("Count to a thousand.", max_tokens=400, ignore_eos=True, stream=True)
    with httpx.stream("POST", f"{fleet.url}/v1/chat/completions", json=body, timeout=60) as reply:
        lines = reply.iter_lines()
        for _ in range(6):
            next(lines)
        assert wait_until(lambda: _running(fleet) == 1, timeout=10)
    assert wait_until(lambda: _running(fleet) == 0, timeout=15), "the replica still decodes for a gone client"


def test_a_killed_replica_ends_its_requests_cleanly_and_the_fleet_recovers(fleet) -> None:
    """Runs last: it kills a replica. Its streamed request ends with an error event, its
    unstreamed ones with a 503; the other replica's are untouched; Ray brings up a new one."""
    long = chat_body("Tell me a long story.", max_tokens=300, ignore_eos=True)
    with ThreadPoolExecutor(4) as pool, \
            httpx.stream("POST", f"{fleet.url}/v1/chat/completions", json={**long, "stream": True},
                         timeout=120) as streamed:
        victim = streamed.headers[HEADER]
        pid = next(r["pid"] for r in fleet.alive_replicas() if r["id"] == victim)
        whole = [pool.submit(httpx.post, f"{fleet.url}/v1/chat/completions", json=long, timeout=120)
                 for _ in range(3)]
        raw, killed = "", threading.Event()
        for line in streamed.iter_lines():
            raw += line + "\n"
            if raw.count("data:") == 5 and not killed.is_set():
                os.kill(pid, signal.SIGKILL)
                killed.set()
        events = parse_sse(raw)
        assert "[DONE]" not in events
        assert isinstance(events[-1], dict) and "error" in events[-1], "an error event ends the stream"
        assert f"replica {victim}" in events[-1]["error"]["message"]
        for done in whole:
            reply = done.result()
            if reply.headers.get(HEADER) == victim or reply.status_code != 200:
                assert reply.status_code == 503 and victim in reply.json()["error"]["message"]
            else:
                assert reply.json()["usage"]["completion_tokens"] == 300
    assert httpx.get(f"{fleet.url}/health").status_code == 200, "one replica up: the fleet serves"
    reply = httpx.post(f"{fleet.url}/v1/chat/completions", json=chat_body("hi", max_tokens=2), timeout=60)
    assert reply.status_code == 200 and reply.headers[HEADER] != victim
    assert wait_until(lambda: len(fleet.alive_replicas()) == 2 and victim not in
                      {r["id"] for r in fleet.alive_replicas()}, timeout=180, interval=1), "Ray restarts it"


def test_a_constrained_request_and_a_tool_call_answer_as_the_single_server(fleet, server) -> None:
    """The constraint travels to the replica as text and is compiled there: the same bits."""
    schema = {"type": "object", "properties": {"river": {"type": "string", "maxLength": 20}}, "required": ["river"],
              "additionalProperties": False}
    tool = {"type": "function", "function": {"name": "find", "parameters": schema}}
    for fields in ({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}},
                   {"tools": [tool], "tool_choice": "required"}):
        body = chat_body(PROMPT, max_tokens=30, logprobs=True, top_logprobs=2, **fields)
        ours, theirs = (httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).json()
                        for url in (fleet.url, server.url))
        for reply in (ours, theirs):  # call ids are fresh per reply
            for call in reply["choices"][0]["message"].get("tool_calls") or []:
                call["id"] = "call"
        assert ours["choices"] == theirs["choices"]
