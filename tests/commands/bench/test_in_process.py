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
    assert list(row) == ["machine", "engine", "invariance_cost", "roofline", "ratios"]
    assert list(row["engine"]) == ENGINE_KEYS
    assert [len(runs) for runs in row["engine"]["decode_runs"]] == [1, 1]
    assert row["engine"]["prefill_tok_s"] > 0 and row["engine"]["info"]["model_path"] == str(model)
    *rows, run = row["invariance_cost"]
    assert [r["batch"] for r in rows] == [1, 4, 8, 16]
    assert list(rows[0]) == ["batch", "invariant_tok_s", "torch_tok_s", "ratio"]
    assert list(run) == ["decode_paths", "max_tokens", "repeats"] and run["max_tokens"] == 4
    line = row["roofline"]
    assert line["fma_peak_gflops"] > 0 and line["c16_gflops"] is None  # no server, no c=16 band
    # c=1 without a server is the engine's single stream, read against the bytes a step reads
    assert abs(line["c1_gb_s"] - line["bytes_per_step"] * row["engine"]["decode_tok_s"] / 1e9) < 1e-3
    assert row["ratios"][0].startswith("machine: ") and row["machine"]["cpu"] in row["ratios"][0]
    assert row["ratios"][1].startswith("logprobs cost (top_logprobs 20, engine")
    assert [r.split(":")[0] for r in row["ratios"][2:]] == ["roofline", "roofline c=1"]


def test_structured(tmp_path):
    model, out = tmp_path / "tiny.gguf", tmp_path / "structured.json"
    write_tiny_gguf(model)
    args = build_parser().parse_args(["bench", "--structured", "--model", str(model), "--max-tokens", "4",
                                      "--repeats", "1", "--json", str(out)])
    assert args.run(args) == 0
    row = json.loads(out.read_text())["structured"]
    assert list(row) == ["model", "vocab", "max_tokens", "repeats", "rows"] and row["model"] == "tiny.gguf"
    assert [r["concurrency"] for r in row["rows"]] == [1, 16]
    assert list(row["rows"][0]) == ["concurrency", "free_tok_s", "constrained_tok_s", "cost", "mask_wait_ms_per_step",
                                    "auto_tools_tok_s", "auto_tools_cost", "auto_tools_mask_wait_ms_per_step"]
    assert all(r["auto_tools_tok_s"] > 0 for r in row["rows"])


def test_the_footprint_counts_what_the_spec_says(tmp_path):
    """The roofline's operations a token, from the loaded weights' shapes, against the same
    count from the hyperparameters alone; its bytes against the weights' own sizes."""
    from batchproof.commands.bench import in_process, roofline

    model = tmp_path / "tiny.gguf"
    write_tiny_gguf(model, TinySpec(num_layers=2))
    engine = in_process.load_engine(model, prefix_cache=False)
    s, context = engine.spec, 40
    q_dim, kv_dim = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    per_layer = (q_dim + 2 * kv_dim) * s.dim + s.dim * q_dim + 2 * s.ffn_dim * s.dim + s.dim * s.ffn_dim
    attention = 2 * s.num_heads * s.head_dim * context
    footprint = roofline.footprint(engine, context)
    assert footprint.flops_per_token == 2 * (s.num_layers * (per_layer + attention) + s.vocab_size * s.dim)
    assert footprint.kv_bytes_per_step == s.num_layers * 2 * kv_dim * 4 * context
    m = engine.model
    layers = sum(w.nbytes if hasattr(w, "parts") else w.numel() * w.element_size()
                 for layer in m.layers for w in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down))
    head = m.lm_head.nbytes if hasattr(m.lm_head, "parts") else m.lm_head.numel() * m.lm_head.element_size()
    embed_row = 0 if m.embed is m.lm_head else head // s.vocab_size
    assert footprint.weight_bytes_per_step == layers + head + embed_row


def test_the_engine_in_process_runs_the_served_engines_flags(tmp_path):
    """`--serve-arg` flags that set the engine (numerics, speculation) set the engine measured in
    process too, so its figures and the HTTP cost compare like with like (they once measured
    float32 with speculation beside an int8 server without it); server flags are left to serve."""
    from batchproof.commands.bench.in_process import engine_config
    from batchproof.engine.config import EngineConfig

    config = engine_config(["--numerics=int8", "--no-speculative", "--port", "9", "--api-key-file", "k"],
                           model_path=None, device="cpu", prefix_cache=False)
    assert (config.numerics, config.speculative, config.prefix_cache, config.device) == ("int8", False, False, "cpu")
    assert engine_config([]) == EngineConfig()

    model, out = tmp_path / "tiny.gguf", tmp_path / "speed.json"
    write_tiny_gguf(model, TinySpec(context_len=4096))
    args = build_parser().parse_args(["bench", "--model", str(model), "--max-tokens", "4", "--repeats", "1",
                                      "--serve-arg=--no-speculative", "--json", str(out)])
    assert args.run(args) == 0
    assert json.loads(out.read_text())["engine"]["info"]["speculative"]["enabled"] is False
