"""The default bench over HTTP, end to end against scripted servers (no engine, no model): the
figures it writes, the requests it sends, and its exit code when a server fails."""

import json

from batchproof.cli import build_parser
from tests.helpers.scripted_server import Script, ScriptedServer

SERVER_KEYS = ["decode_tok_s", "decode_top20_tok_s", "decode_runs", "ttft_600_s", "url", "model", "bands"]


def bench(*flags: str) -> int:
    args = build_parser().parse_args(["bench", "--no-engine", "--max-tokens", "8", "--repeats", "2", *flags])
    return args.run(args)


def test_ours_against_a_peer(tmp_path):
    out = tmp_path / "speed.json"
    with ScriptedServer(Script()) as ours, ScriptedServer(Script()) as peer:
        assert bench("--url", ours.url + "/", "--vs", peer.url, "--concurrency", "1,4", "--band-repeats", "3",
                     "--json", str(out)) == 0
    row = json.loads(out.read_text())
    assert list(row) == ["machine", "ours", "peer", "ratios"]
    assert list(row["ours"]) == list(row["peer"]) == SERVER_KEYS  # no process of ours: no peak memory
    assert row["ours"]["url"] == ours.url and row["ours"]["model"] == "fake-model"
    assert [(b["c"], b["runs"]) for b in row["ours"]["bands"]] == [(1, 3), (4, 3)]
    assert [len(runs) for runs in row["ours"]["decode_runs"]] == [2, 2]
    assert row["ours"]["bands"][1]["aggregate_tok_s"] > 0 and row["ours"]["ttft_600_s"] > 0
    assert any(line.startswith("single stream ours / peer") for line in row["ratios"])
    # Per round, per server: a plain decode, a top-20 one, a one-token TTFT request with a prompt
    # no earlier round sent; llama-server's own prompt cache is turned off for the peer only.
    ttft = [[b for b in server.state.requests if b["max_tokens"] == 1] for server in (ours, peer)]
    assert [len(requests) for requests in ttft] == [2, 2]
    assert len({b["messages"][0]["content"] for b in ttft[0]}) == 2
    assert [b.get("cache_prompt") for b in ttft[1]] == [False, False]
    assert not any("cache_prompt" in b for b in ours.state.requests)
    assert sum(b.get("top_logprobs") == 20 for b in ours.state.requests) == 2


def test_a_failing_server_exits_1(capsys):
    with ScriptedServer(Script(status=500)) as failing:
        assert bench("--url", failing.url) == 1
    assert capsys.readouterr().err.startswith(f"batchproof bench: {failing.url}: ")
