"""`batchproof generate` in a subprocess: one clear line for a bad model, and the --json shape."""

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import pytest

from batchproof.engine.model.default_model import default_model_path
from batchproof.engine.sampling.params import SamplingParams

FRANCE = "What is the capital of France?"
MAX_PARALLEL = 2


def bad_models(directory: Path) -> dict[str, Path]:
    real = default_model_path()
    size = real.stat().st_size
    assert size // 2 > gguf.GGUFReader(real).data_offset
    (directory / "a-directory.gguf").mkdir()
    (directory / "empty.gguf").write_bytes(b"")
    (directory / "notes.txt").write_text("not a model at all\n")
    paths = {
        "missing": directory / "no-such-model.gguf",
        "directory": directory / "a-directory.gguf",
        "empty": directory / "empty.gguf",
        "not-gguf": directory / "notes.txt",
    }
    with real.open("rb") as f:  # cut in the tensor data: the header and metadata are whole
        paths["truncated"] = directory / "truncated.gguf"
        paths["truncated"].write_bytes(f.read(size // 2))
    return paths


GOOD_RUNS = {"json": ["--prompt", FRANCE, "--json", "--top-logprobs", "3", "--max-tokens", "12"]}


@pytest.fixture(scope="module")
def cli(tmp_path_factory) -> dict[str, tuple[int, str, str, Path | None]]:
    """Every subprocess of this module, run a few at a time: name -> (exit code, stdout, stderr, model)."""
    models = bad_models(tmp_path_factory.mktemp("models"))
    commands = dict(GOOD_RUNS)  # the longest first
    commands |= {name: ["--prompt", "hi", "--model", str(path), "--max-tokens", "2"] for name, path in models.items()}
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    pending = list(commands.items())
    running: dict[str, subprocess.Popen] = {}
    results = {}
    while pending or running:
        while pending and len(running) < MAX_PARALLEL:  # a few at a time: each one imports torch
            name, args = pending.pop(0)
            running[name] = subprocess.Popen(
                [sys.executable, "-m", "batchproof", "generate", "--device", "cpu", *args],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        name, proc = next(iter(running.items()))
        out, err = proc.communicate(timeout=300)
        results[name] = (proc.returncode, out, err, models.get(name))
        del running[name]
    return results


# Other truncation points, an unreadable tensor type and other bad files are covered in-process
# by test_model_file.py and test_engine_tiny.py; each subprocess here costs a torch import.
BAD = ["missing", "directory", "empty", "not-gguf", "truncated"]


@pytest.mark.parametrize("name", BAD)
def test_a_bad_model_is_one_line_naming_the_file_and_a_nonzero_exit(cli, name: str) -> None:
    code, out, err, path = cli[name]
    assert code != 0
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert str(path) in lines[0]
    assert out == ""


def expected_run(engine, max_tokens: int, top_logprobs: int | None, ignore_eos: bool = False):
    prompt = engine.chat_prompt_ids([{"role": "user", "content": FRANCE}])
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, top_logprobs=top_logprobs, ignore_eos=ignore_eos)
    deltas = engine.generate({"cli-check": (prompt, params)})["cli-check"]
    return prompt, deltas


def test_json_output_shape_and_values_equal_the_in_process_engine(cli, engine) -> None:
    code, out, err, _ = cli["json"]
    assert code == 0, err
    reply = json.loads(out)
    assert set(reply) == {"text", "finish_reason", "prompt_ids", "tokens"}
    prompt, deltas = expected_run(engine, 12, 3)
    records = [r for d in deltas for r in d.records]
    assert reply["prompt_ids"] == prompt
    assert reply["finish_reason"] == deltas[-1].finish_reason == "stop"
    assert reply["text"] == "".join(d.text for d in deltas) == "The capital of France is Paris."
    assert len(reply["tokens"]) == len(records) > 0
    for token, record in zip(reply["tokens"], records):
        assert set(token) == {"id", "token", "bytes", "logprob", "top"}
        raw = bytes(token["bytes"])
        assert token["id"] == record.token_id and raw == engine.tokenizer.decode_bytes(record.token_id)
        assert token["token"] == raw.decode("utf-8", errors="replace")
        assert token["logprob"] == record.logprob
        assert len(token["top"]) == 3
        for alt, entry in zip(token["top"], record.top):
            assert set(alt) == {"id", "token", "logit", "logprob"}
            assert (alt["id"], alt["logit"], alt["logprob"]) == (entry.token_id, entry.logit, entry.logprob)
            assert alt["token"] == engine.tokenizer.token_text(entry.token_id)
        assert [a["logit"] for a in token["top"]] == sorted((a["logit"] for a in token["top"]), reverse=True)
    assert b"".join(bytes(t["bytes"]) for t in reply["tokens"]).decode("utf-8") == reply["text"]
