"""`batchproof report` on the sections of issue 27 with a wrong type anywhere (the per-prompt
references, the cache cases, stream parity, fail-open): drawn, or refused in one line naming the
key (exit 4), never a traceback. The sample witness of test_fields has none of these sections."""

import copy
from pathlib import Path

import pytest

from tests.report.witness_sample import put, report, sample_witness

DIFF = {"refused": None, "tokens_agree_to": 12, "text_equal": True, "logprob_max_abs_diff": 1e-6,
        "logprobs_bitwise_equal": False, "logprob_first_diff_at": 0, "attributable": True, "not_attributable": None}
FINDING = {"kind": "logprob", "text": "cache: case system, warm alone #1: logprobs differ", "attributable": True}


def full_witness() -> dict:
    """The sample witness with every section the probe's modes add, as `--cache --stream-parity` writes them."""
    witness = sample_witness()
    witness["references"] = [{"prompt": 0, "stable": True, "tokens": 12, "self_divergence_at": 12,
                              "logprob_max_abs_diff": 0.0, "logprobs_bitwise_equal": True,
                              "logprob_first_diff_at": None, "replicas": [None, None], "cached_tokens": [0, 15]}]
    witness["reference_logprobs"] = {"logprobs_stable": True, "logprob_reason": None}
    witness["cache"] = {"result": "FAIL", "reason": FINDING["text"], "findings": [FINDING], "num_hits": 2,
                        "cases": [{"case": "system", "shares": "the system prompt",
                                   "cold": {"cached_tokens": 0, "completion_tokens": 12, "refused": None},
                                   "warmer": {"cached_tokens": 190, "completion_tokens": 12, "refused": None},
                                   "slots": [{"c": 1, "i": 0, "cached_tokens": 198, **DIFF},
                                             {"c": 4, "i": 3, "cached_tokens": 198, **DIFF}]}]}
    witness["stream_parity"] = {"result": "PASS", "reason": None, "sample": "every band slot", "num_pairs": 1,
                                "findings": [], "pairs": [{"where": "m=1", **DIFF}]}
    witness["fail_open"] = [{"route": "/v1/chat/completions", "streamed": True, "requests": 1, "what": "no logprobs"}]
    witness["dropped_fields"] = ["ignore_eos"]
    witness["extra_body"] = {"cache_prompt": False}
    return witness




def test_the_full_witness_is_drawn(tmp_path: Path) -> None:
    code, out, err = report(tmp_path, full_witness())
    page = (tmp_path / "r.html").read_text()
    assert (code, err) == (0, "") and out.startswith("report: ")
    assert '<h2 id="cache">' in page and '<h2 id="stream-parity">' in page and "0, 15" in page


@pytest.mark.parametrize(("path", "value", "says"), [
    (("references", 0, "cached_tokens"), 15, "references[0].cached_tokens must be a list or null, got 15"),
    (("references", 0, "cached_tokens"), ["15"], 'references[0].cached_tokens[0] must be an integer or null, '
                                                 'got "15"'),
    (("references", 0, "cached_tokens"), {"run": 1}, "references[0].cached_tokens must be a list or null, "
                                                     "got an object"),
])
def test_a_wrong_typed_cached_tokens_is_refused_by_name(tmp_path: Path, path: tuple, value: object, says: str) -> None:
    code, out, err = report(tmp_path, put(full_witness(), path, value))
    assert (code, out) == (4, "")
    assert err == f"batchproof report: witness {tmp_path / 'w.json'}: {says}\n"
    assert not (tmp_path / "r.html").exists()


def test_a_cache_slot_without_a_number_is_drawn_as_unknown(tmp_path: Path) -> None:
    witness = full_witness()
    for slot in witness["cache"]["cases"][0]["slots"]:
        slot["i"] = None
    code, _, err = report(tmp_path, witness)
    page = (tmp_path / "r.html").read_text()
    assert (code, err) == (0, "")
    assert "warm alone #-" in page and "warm c=4 slot -" in page


def test_a_fail_open_witness_with_null_bands_is_drawn(tmp_path: Path) -> None:
    code, _, err = report(tmp_path, put(full_witness(), ("bands",), None))
    assert (code, err) == (0, "") and "FAIL-OPEN" in (tmp_path / "r.html").read_text()


def _paths(value: object, prefix: tuple = ()) -> list[tuple]:
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return []
    return [path for key, child in items for path in [(*prefix, key), *_paths(child, (*prefix, key))]]


# The bands and slots are test_fields' (its fuzz puts any value at any of their keys).
SECTIONS = ("references", "reference_logprobs", "cache", "stream_parity", "fail_open", "dropped_fields",
            "extra_body")
SECTION_PATHS = [path for path in _paths(full_witness()) if path[0] in SECTIONS]
WRONG = [None, -1, 2.5, "x", True, [], {}, [None], [{"i": None}]]


@pytest.mark.parametrize("path", SECTION_PATHS, ids=lambda path: ".".join(map(str, path)))
def test_any_wrong_value_in_a_section_is_drawn_or_refused_in_one_line(tmp_path: Path, path: tuple) -> None:
    witness = full_witness()
    for value in WRONG:
        code, out, err = report(tmp_path, put(copy.deepcopy(witness), path, value))
        if code == 0:
            assert out.startswith("report: ") and err == "", (value, err)
        else:
            assert (code, out) == (4, "") and err.count("\n") == 1, (value, err)
