"""`batchproof board` end to end on a tiny board: scripted servers reached by URL, commands that fail
to start, exit or never get ready, and the built-in drift control; every row as its server earns."""

import json
import sys
from pathlib import Path

import pytest
import yaml

from batchproof.check.contract import shipped_contract_text
from tests.helpers.check_support import run_cli
from tests.helpers.quirky_server import QuirkyServer
from tests.helpers.scripted_server import SMALL_MATRIX, Script, ScriptedServer, closed_port_url

# Slow enough that every stream arrives in bursts the probe can time, whatever the machine's load
# (S7 is measured, and the contract's ratio 0 passes any measured rate).
SCRIPT = {"has_histogram": True, "token_delay_s": 0.02}


def write_board(tmp_path: Path, servers: list[dict]) -> Path:
    (tmp_path / "matrix.yaml").write_text(SMALL_MATRIX)
    contract = yaml.safe_load(shipped_contract_text()) | {"bands": [1, 4], "declared_min_floor": 6,
                                                          "decode_ratio_c4_over_c1": 0.0}
    (tmp_path / "contract.yaml").write_text(yaml.safe_dump(contract))
    model = tmp_path / "fake.gguf"
    model.write_bytes(b"GGUF")  # named by its hash in the witness; the scripted servers need none
    board = {"matrix": "matrix.yaml", "contract": "contract.yaml", "host": "test-host",
             "servers": [{"model": "fake.gguf", "commit": "c", "binary_sha256": "b" * 64, **s} for s in servers]}
    path = tmp_path / "board.yaml"
    path.write_text(yaml.safe_dump(board, sort_keys=False))
    return path


def run_board(board: Path, out: Path) -> tuple[int, dict, str]:
    code, stdout, stderr = run_cli(["board", str(board), "--out", str(out)])
    assert (out / "board.json").is_file(), stderr[-3000:]
    return code, json.loads((out / "board.json").read_text()), stdout


def rows_of(board: dict) -> dict[tuple[str, str], dict]:
    return {(row["server"], row["configuration"]): row for row in board["rows"]}


def test_a_tiny_board_gives_each_server_its_row_and_catches_the_control(tmp_path: Path) -> None:
    exits = [sys.executable, "-c", "import sys; print('no model here'); sys.exit(3)"]
    sleeps = [sys.executable, "-c", "import time; time.sleep(60)"]
    with QuirkyServer(Script(**SCRIPT)) as good:
        board_file = write_board(tmp_path, [
            {"name": "scripted", "url": good.url, "configurations": ["identical", "stream-parity"]},
            {"name": "nobody home", "url": closed_port_url(), "configurations": ["identical", "mixed"]},
            {"name": "exits", "command": exits, "configurations": ["identical"]},
            {"name": "never ready", "command": sleeps, "ready_timeout_s": 1, "configurations": ["identical"]},
            {"name": "not installed", "command": "$BOARD_TEST_UNSET_SERVER --port {port}",
             "configurations": ["identical"]},
        ])
        code, board, stdout = run_board(board_file, tmp_path / "out")
    rows = rows_of(board)
    assert code == 0 and board["valid"] is True and board["invalid_because"] == []
    for configuration in ("identical", "stream-parity"):
        row = rows[("scripted", configuration)]
        assert (row["verdict"], row["agree"]) == ("ADMISSIBLE", True), row
        assert [run["verdict"] for run in row["runs"]] == ["ADMISSIBLE", "ADMISSIBLE"]
        assert all(band["logprob_max_abs_diff"] == 0.0 for run in row["runs"] for band in run["bands"])
    assert rows[("scripted", "stream-parity")]["runs"][0]["stream_parity"]["result"] == "PASS"
    assert rows[("scripted", "identical")]["runs"][0]["stream_parity"] is None
    # The witnesses and report pages are written beside the board, named in its rows.
    for run in rows[("scripted", "identical")]["runs"]:
        assert json.loads((tmp_path / "out" / run["witness"]).read_text())["result"] == "PASS"
        assert (tmp_path / "out" / run["report"]).read_text().startswith("<!DOCTYPE html>")

    unreachable = rows[("nobody home", "identical")]
    assert unreachable["verdict"] == "UNREACHABLE" and "cannot connect" in unreachable["why"]
    assert len(unreachable["runs"]) == 1  # not probed a second time
    assert rows[("nobody home", "mixed")]["verdict"] == "NOT RUN"
    assert rows[("exits", "identical")]["verdict"] == "NOT RUN"
    assert rows[("exits", "identical")]["why"] == "exited with status 3 before it was ready: no model here"
    assert rows[("never ready", "identical")]["why"].startswith("not ready within 1 s")
    assert rows[("not installed", "identical")]["why"] == "command not found: $BOARD_TEST_UNSET_SERVER"

    control = rows[("drift control (built in)", "identical")]
    assert control["control"] is True and control["verdict"] == "NOT ADMISSIBLE" and control["agree"] is True
    for run in control["runs"]:
        c4 = next(band for band in run["bands"] if band["c"] == 4)
        assert c4["logprobs_bitwise_equal"] is False and c4["logprob_max_abs_diff"] > 0
        assert [reason[:15] for reason in run["reasons"]] == ["logprobs: c=4 l"]  # for batching alone

    page = (tmp_path / "out" / "board.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "board VALID" in page
    assert not any(tag in page for tag in ("<script", "<link", "src=", 'href="http'))  # offline: nothing fetched
    assert "exited with status 3" in page and "drift control (built in)" in page
    assert "board VALID" in stdout


def test_a_control_that_passes_makes_the_board_invalid(tmp_path: Path) -> None:
    with ScriptedServer(Script(**SCRIPT)) as good:
        board_file = write_board(tmp_path, [
            {"name": "well behaved", "url": good.url, "configurations": ["identical"], "control": True},
        ])
        code, board, stdout = run_board(board_file, tmp_path / "out")
    assert code == 5 and board["valid"] is False
    assert board["invalid_because"] == ["negative control well behaved · identical was ADMISSIBLE, not caught "
                                        "NOT ADMISSIBLE for batching in both runs"]
    assert "board INVALID" in stdout
    assert "board INVALID" in (tmp_path / "out" / "board.html").read_text()


def test_a_control_that_is_unreachable_is_not_caught(tmp_path: Path) -> None:
    board_file = write_board(tmp_path, [
        {"name": "gone", "url": closed_port_url(), "configurations": ["identical"], "control": True},
    ])
    code, board, _ = run_board(board_file, tmp_path / "out")
    assert code == 5 and board["invalid_because"][0].startswith("negative control gone · identical was UNREACHABLE")


@pytest.mark.parametrize(("entry", "message"), [
    ({"name": "a", "url": "http://x", "configurations": ["identcal"]},
     "servers[0].configurations: 'identcal' is not one of identical, mixed, cache, stream-parity, fleet"),
    ({"name": "a", "url": "http://x", "command": "srv", "configurations": ["identical"]},
     "servers[0]: give `url` or `command`, exactly one (server 'a')"),
    ({"name": "a", "url": "http://x", "configurations": ["identical"], "prbe": {}},
     "servers[0].prbe: is not a board key"),
    ({"name": "a", "url": "http://x", "configurations": ["identical"], "ready_timeout_s": -1},
     "servers[0].ready_timeout_s: must be a number > 0, got -1"),
    ({"name": "a", "url": "http://x", "configurations": ["identical"], "probe": {"route": "chats"}},
     "servers[0].probe.route: 'chats' is not one of"),
    ({"name": "a", "url": "http://x", "configurations": ["identical", "cache"],
      "probe": {"extra_body": {"seed": 3}}},
     "servers[0].probe: --extra-body must not set 'seed': the matrix and the probe decide it "
     "(configuration identical)"),
    ({"name": "a", "url": "ftp://x", "configurations": ["identical"]},
     "servers[0].url: --url 'ftp://x' must be an http:// or https:// URL with a host (configuration identical)"),
    ({"name": "a", "url": "http://x", "configurations": ["identical"], "control": "yes"},
     "servers[0].control: must be true or false, got 'yes'"),
])
def test_a_malformed_board_exits_2_naming_the_key_and_value(tmp_path: Path, entry: dict, message: str) -> None:
    board = tmp_path / "board.yaml"
    board.write_text(yaml.safe_dump({"servers": [entry]}))
    code, stdout, stderr = run_cli(["board", str(board), "--out", str(tmp_path / "out")])
    assert (code, stdout) == (2, "")
    assert stderr.startswith(f"batchproof board: {board}: {message}"), stderr
    assert not (tmp_path / "out").exists()  # nothing ran


def test_a_board_that_is_not_yaml_or_names_a_bad_matrix_exits_2(tmp_path: Path) -> None:
    board = tmp_path / "board.yaml"
    board.write_text("servers: [\n")
    assert run_cli(["board", str(board), "--out", str(tmp_path)])[0] == 2
    (tmp_path / "matrix.yaml").write_text("ladder: {declared: [0]}\n")
    board.write_text(yaml.safe_dump({"matrix": "matrix.yaml", "servers": [
        {"name": "a", "url": "http://x", "configurations": ["identical"]}]}))
    code, _, stderr = run_cli(["board", str(board), "--out", str(tmp_path / "out")])
    assert code == 2 and "matrix.yaml: missing key protocol" in stderr


def test_a_resumed_board_checks_the_witnesses_it_finds_and_probes_the_rest(tmp_path: Path) -> None:
    """--resume: a run whose witness is there is checked again, not probed; one whose witness was cut
    off (a board killed while writing it) is probed; the server is started only for what is missing."""
    out = tmp_path / "out"
    with ScriptedServer(Script(**SCRIPT)) as good:
        board_file = write_board(tmp_path, [
            {"name": "scripted", "url": good.url, "configurations": ["identical", "mixed"]}])
        _, first, _ = run_board(board_file, out)
    # The server is gone now; the second run of `mixed` lost its witness mid-write.
    (out / "00-scripted" / "mixed-run2.json").write_text('{"witness_version": 3, "resu')
    code, stdout, stderr = run_cli(["board", str(board_file), "--out", str(out), "--resume"])
    board, before = rows_of(json.loads((out / "board.json").read_text())), rows_of(first)
    assert board[("scripted", "identical")] == before[("scripted", "identical")]  # kept, judged alike
    assert board[("drift control (built in)", "identical")]["verdict"] == "NOT ADMISSIBLE"  # kept: not started
    mixed = board[("scripted", "mixed")]
    assert mixed["runs"][0] == before[("scripted", "mixed")]["runs"][0]
    assert mixed["verdict"] == "UNREACHABLE" and "cannot connect" in mixed["why"]  # run 2 was probed again
    assert code == 0 and "board VALID" in stdout


def test_a_server_not_deterministic_alone_gets_a_row_and_the_board_goes_on(tmp_path: Path) -> None:
    """Its two m=1 references differ, so the probe fires no band: nothing to check, and the run
    says why (llama-server with its prompt cache on, once) instead of stopping the board."""
    from tests.helpers.scripted_server import unstable_alone

    with ScriptedServer(Script(**SCRIPT, pick=unstable_alone)) as shaky:
        board_file = write_board(tmp_path, [{"name": "shaky", "url": shaky.url, "configurations": ["identical"]}])
        code, board, _ = run_board(board_file, tmp_path / "out")
    first, second = rows_of(board)[("shaky", "identical")]["runs"]  # (the second run's references agree)
    assert first["verdict"] == "NOT ADMISSIBLE" and first["bands"] == []
    assert first["reasons"][0].startswith("reference: the m=1 reference is not stable: the two m=1 runs part")
    assert (tmp_path / "out" / first["report"]).is_file()
    assert code == 0 and rows_of(board)[("drift control (built in)", "identical")]["verdict"] == "NOT ADMISSIBLE"
