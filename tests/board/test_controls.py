"""The negative controls a board adds to the servers its file lists: the built-in drift server always,
and our own server without batch invariance when the file starts ours by command."""

from pathlib import Path

import pytest

from batchproof.board.run import DRIFT, with_controls
from batchproof.board.spec import board_from_mapping


def board(*commands: str) -> list:
    servers = [{"name": f"s{i}", "command": command, "configurations": ["identical", "cache"]}
               for i, command in enumerate(commands)]
    return with_controls(board_from_mapping({"servers": servers}, Path("/boards")))


def test_the_drift_control_is_always_there() -> None:
    *listed, drift = board("llama-server -m m.gguf --port {port}")
    assert [s.name for s in listed] == ["s0"] and not listed[0].is_control
    assert (drift.builtin, drift.is_control, drift.configurations) == (DRIFT, True, ("identical",))


@pytest.mark.parametrize("ours", ["batchproof serve --port {port}",
                                  "/venv/bin/python -m batchproof serve --port {port}"])
def test_our_server_by_command_gets_a_control_without_batch_invariance(ours: str) -> None:
    servers = board("llama-server --port {port}", ours, f"{ours} --numerics int8")
    control = servers[-1]
    assert control.name == "s1 --no-batch-invariant" and control.is_control
    assert control.command == (*ours.split(), "--no-batch-invariant")  # the first of ours, once
    assert control.configurations == ("identical",)
    assert [s.name for s in servers if s.is_control] == ["drift control (built in)", "s1 --no-batch-invariant"]


@pytest.mark.parametrize("command", ["batchproof fleet --replicas 2 --port {port}", "llama-server serve",
                                     "transformers serve --port {port}"])
def test_other_commands_get_no_control_of_ours(command: str) -> None:
    assert [s.name for s in board(command) if s.is_control] == ["drift control (built in)"]


def test_paths_are_the_board_files_and_variables_are_expanded(monkeypatch) -> None:
    monkeypatch.setenv("BOARD_TEST_MODEL", "/models/m.gguf")
    spec = board_from_mapping({"matrix": "m.yaml", "servers": [
        {"name": "a", "command": ["srv", "-m", "$BOARD_TEST_MODEL"], "model": "$BOARD_TEST_MODEL",
         "configurations": ["identical"]}]}, Path("/boards"))
    assert spec.matrix == Path("/boards/m.yaml")
    assert spec.servers[0].command == ("srv", "-m", "/models/m.gguf")
    assert spec.servers[0].model == Path("/models/m.gguf")


@pytest.mark.parametrize("stagger_s", [0.0, 0.03])
def test_the_drift_server_gives_every_member_of_a_burst_the_same_batch(tmp_path: Path, stagger_s: float) -> None:
    """16 requests at once (more than socketserver's listen backlog of 5), or 30 ms apart (a burst of
    half a second, as a busy machine sends one), form one batch of 16: each reply's logprobs moved
    by 15 drifts, and the log says m=16 once."""
    import json
    import threading
    import time
    import urllib.request

    from batchproof.board.drift_server import DriftServer, entry

    log, replies = tmp_path / "drift.log", []

    def ask(url: str) -> None:
        body = json.dumps({"model": "drift-control", "max_tokens": 2, "messages": []}).encode()
        request = urllib.request.Request(f"{url}/v1/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            replies.append(json.load(response)["choices"][0]["logprobs"]["content"][0]["logprob"])

    with DriftServer(log, window_s=0.1) as server:
        threads = [threading.Thread(target=ask, args=(server.url,)) for _ in range(16)]
        for thread in threads:
            thread.start()
            time.sleep(stagger_s)
        for thread in threads:
            thread.join()
    assert replies == [entry(0, 16, 1e-3)["logprob"]] * 16
    assert log.read_text().count("batch m=") == 1 and "batch m=16 done" in log.read_text()
