"""`batchproof witness --fleet N` (and its other probe flags): the server it starts and the probe
flags it passes, without starting either (the end-to-end run needs Ray Serve and a model)."""

import argparse
import sys
from pathlib import Path

from batchproof.commands import witness


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    witness.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_fleet_witness_starts_batchproof_fleet_with_the_replicas(tmp_path: Path) -> None:
    log = tmp_path / "batch.log"
    command = witness.serve_command(parse("--fleet", "3", "--serve-arg=--max-batch=8"), 8123, log)
    assert command == [sys.executable, "-m", "batchproof", "fleet", "--replicas", "3", "--port", "8123",
                       "--log-file", str(log), "--max-batch=8"]
    assert witness.serve_command(parse("--model", "m.gguf"), 8123, log) == [
        sys.executable, "-m", "batchproof", "serve", "--port", "8123", "--log-file", str(log), "--model", "m.gguf"]


def test_a_fleet_of_one_is_refused_before_anything_starts(capsys) -> None:
    assert witness.run(parse("--fleet", "1")) == 2
    assert "--fleet needs at least 2 replicas, got 1" in capsys.readouterr().err


def test_the_matrix_the_cache_and_the_ladder_reach_the_probe(tmp_path: Path) -> None:
    info = {"model_path": "/m/olmoe.gguf", "build_sha256": "ab" * 32, "host": "h"}
    log = tmp_path / "batch.log"
    plain = witness.probe_arguments(parse(), "http://127.0.0.1:9", log, info, None)
    assert plain == ["--url", "http://127.0.0.1:9", "--server-log", str(log), "--witness", "witness.json",
                     "--model-file", "/m/olmoe.gguf", "--binary-sha256", "ab" * 32, "--host", "h"]
    asked = witness.probe_arguments(parse("--matrix", "moe.yaml", "--cache", "--ladder", "1,4", "--fleet", "2"),
                                    "http://127.0.0.1:9", log, info, "c0ffee")
    assert asked == plain + ["--commit", "c0ffee", "--ladder", "1,4", "--matrix", "moe.yaml", "--cache", "--fleet"]
