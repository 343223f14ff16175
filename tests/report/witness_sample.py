"""A small mixed-mode witness for the report tests: c=4's slot 1 leaves its reference at token 5,
every c=4 slot's logprobs differ from token 0, and c=4's rate is under the S7 line."""

import json
from pathlib import Path
from typing import Any

from tests.helpers.check_support import run_cli


def slot(i: int, divergence_at: int = 12, bitwise: bool = True, rate: float = 40.0, **extra: Any) -> dict[str, Any]:
    return {
        "i": i, "completion_tokens": 12, "finish_reason": "length", "refused": None, "decode_tok_s": rate,
        "prompt": i, "stream_mode": "declared", "stream_mode_conflict": None, "divergence_at": divergence_at,
        "top2_margin_at_divergence": 1.9 if divergence_at < 12 else None,
        "logprob_max_abs_diff": 0.0 if bitwise else 1e-5, "logprobs_bitwise_equal": bitwise,
        "logprob_first_diff_at": None if bitwise else 0, **extra,
    }


def band(c: int, slots: list[dict[str, Any]], rate: float) -> dict[str, Any]:
    worst = min(slots, key=lambda s: s["divergence_at"])
    equal = all(s["logprobs_bitwise_equal"] for s in slots)
    return {
        "c": c, "m_formed": c, "m_formed_source": "slots", "result": "PASS",
        "divergence_at": worst["divergence_at"], "intra_agree_to": worst["divergence_at"], "max_constant_run": 1,
        "declared_min": 6, "max_constant_run_declared": 4, "reason": None, "decode_tok_s": rate,
        "divergence_slot": worst["i"], "logprob_max_abs_diff": 0.0 if equal else 1e-5, "logprobs_bitwise_equal": equal,
        "slots": slots,
    }


def sample_witness() -> dict[str, Any]:
    four = [slot(0, bitwise=False, rate=15.0), slot(1, 5, bitwise=False, rate=15.0),
            slot(2, bitwise=False, rate=15.0),
            slot(3, bitwise=False, rate=15.0, stream_mode="buffered", decode_tok_s=None,
                 stream_mode_conflict="declared stream_mode live, but its content arrived buffered")]
    bands = [band(1, [slot(0)], 40.0), band(4, four, 15.0)]
    return {
        "witness_version": 3, "probe": "batchproof", "host": "box <1>", "commit": "abc", "binary_sha256": "b" * 64,
        "model": {"path": "SmolLM2-135M-Instruct.Q4_1.gguf",
                  "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"},
        "prompt_sha256": "c" * 64,
        "sampler": {"temperature": 0.0, "seed": 0, "ignore_eos": True, "max_tokens": 12, "top_logprobs": 2},
        "declared_min": 6, "served_model": "m", "server": None,
        "reference": {"stable": True, "tokens": 12, "self_divergence_at": 12},
        "bands": bands, "result": "PASS", "mode": "mixed", "route": "chat", "stagger_ms": 0.0,
        "prompts": [{"i": i, "sha256": "d" * 64, "chars": 10 + i} for i in range(4)], "references": [],
    }


def put(witness: dict, path: tuple, value: object) -> dict:
    """`witness` with the field at `path` (keys and indices) set to `value`."""
    node = witness
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return witness


def report(directory: Path, witness: dict) -> tuple[int, str, str]:
    """`batchproof report` on `witness` written into `directory`: (exit code, stdout, stderr)."""
    path = directory / "w.json"
    path.write_text(json.dumps(witness))
    (directory / "r.html").unlink(missing_ok=True)
    return run_cli(["report", str(path), "-o", str(directory / "r.html")])
