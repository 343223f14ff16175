"""The default bench's in-process figures and the invariance cost, end to end on a tiny random
model (no server): every figure the file holds, in its place."""

import json

from batchproof.cli import build_parser
from tests.helpers.tiny_gguf import TinySpec, write_tiny_gguf

ENGINE_KEYS = ["load_s", "info", "prefill_tokens", "prefill_tok_s", "decode_tok_s", "decode_top20_tok_s",
               "decode_runs", "peak_rss_mb"]


def test_engine_and_invariance_cost(tmp_path):
    model, out = tmp_path / "tiny.gguf", tmp_path / "speed.json"
    write_tiny_gguf(model, TinySpec(context_len=4096))  # room for the prefill figure's ~2,700 byte tokens
    args = build_parser().parse_args(["bench", "--model", str(model), "--max-tokens", "4", "--repeats", "1",
                                      "--invariance-cost", "--json", str(out)])
    assert args.run(args) == 0
    row = json.loads(out.read_text())
    assert list(row) == ["machine", "engine", "invariance_cost", "ratios"]
    assert list(row["engine"]) == ENGINE_KEYS
    assert [len(runs) for runs in row["engine"]["decode_runs"]] == [1, 1]
    assert row["engine"]["prefill_tok_s"] > 0 and row["engine"]["info"]["model_path"] == str(model)
    *rows, run = row["invariance_cost"]
    assert [r["batch"] for r in rows] == [1, 4, 8, 16]
    assert list(rows[0]) == ["batch", "invariant_tok_s", "torch_tok_s", "ratio"]
    assert list(run) == ["decode_paths", "max_tokens", "repeats"] and run["max_tokens"] == 4
    assert row["ratios"] == [row["ratios"][0]] and row["ratios"][0].startswith("logprobs cost (top_logprobs 20, engine")


def test_structured(tmp_path):
    model, out = tmp_path / "tiny.gguf", tmp_path / "structured.json"
    write_tiny_gguf(model)
    args = build_parser().parse_args(["bench", "--structured", "--model", str(model), "--max-tokens", "4",
                                      "--repeats", "1", "--json", str(out)])
    assert args.run(args) == 0
    row = json.loads(out.read_text())["structured"]
    assert list(row) == ["model", "vocab", "max_tokens", "repeats", "rows"] and row["model"] == "tiny.gguf"
    assert [r["concurrency"] for r in row["rows"]] == [1, 16]
    assert list(row["rows"][0]) == ["concurrency", "free_tok_s", "constrained_tok_s", "cost", "mask_wait_ms_per_step"]
