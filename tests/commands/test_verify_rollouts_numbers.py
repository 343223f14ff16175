"""`batchproof verify-rollouts` on the numbers the HTTP route is tested with: vLLM's -9999 clamps
are scored; a line holding a number no float holds (10**400) or a key that only looks like digits
("²") is a bad line named by number and field, not a traceback, and a file with nothing left to
score exits non-zero; a setting past the float range is refused by name."""

import argparse
import json

import pytest

from batchproof.commands import verify_rollouts

GOOD = {"prompt_token_ids": [1, 2, 3], "completion_token_ids": [4, 5, 6], "logprobs": [-1.0, -2.0, -3.0]}


def _run(engine, tmp_path, lines: list[str], **flags) -> int:
    path = tmp_path / "rollouts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    args = argparse.Namespace(file=path, out=tmp_path / "out", model=None, device="cpu", quiet=True,
                              **{"near_tie": 0.05, "tis_cap": None, "mask_band": (0.5, 2.0), **flags})
    return verify_rollouts.run(args, engine=engine)


def test_minus_9999_clamps_are_scored(engine, tmp_path):
    assert _run(engine, tmp_path, [json.dumps({**GOOD, "logprobs": [-9999] * 3})]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["summary"]["num_tokens"] == 3 and report["summary"]["mean_abs_diff"] > 9900


@pytest.mark.parametrize(("line", "field"), [
    ('{"prompt_token_ids": [1], "completion_token_ids": [2], "logprobs": [-1' + "0" * 400 + "]}", "logprobs"),
    ('{"prompt_token_ids": [1], "completion_token_ids": [2], "logprobs": [-1], "top_logprobs": [{"²": -1}]}',
     "top_logprobs"),
])
def test_a_file_of_only_bad_numbers_names_them_and_fails(engine, tmp_path, capsys, line, field):
    assert _run(engine, tmp_path, [line]) == 1
    assert "line 1" in capsys.readouterr().err
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [(b["where"], b["field"]) for b in report["bad_records"]] == [("line 1", field)]


@pytest.mark.parametrize("flags", [{"near_tie": float("1e400")}, {"tis_cap": [2.0, float("inf")]},
                                   {"mask_band": (0.5, float("inf"))}])
def test_a_setting_past_the_float_range_is_refused(engine, tmp_path, capsys, flags):
    assert _run(engine, tmp_path, [json.dumps(GOOD)], **flags) == 2
    assert "finite" in capsys.readouterr().err
