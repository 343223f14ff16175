"""Reading a witness: RED (exit 3 / 4) for what cannot be judged, never a traceback."""

import errno
import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchproof.check.witness import WitnessError, parse_witness, typed_witness
from batchproof.common.band import Band
from tests.helpers.check_support import C1, C4, check_text, check_witness, control, mutated, run_cli, set_band, set_top

JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
WITNESS_KEYS = ["model", "bands", "host", "commit", "binary_sha256", "prompt_sha256"]
BAND_KEYS = ["c", "result", "m_formed", "divergence_at", "declared_min", "top2_margin_at_divergence", "decode_tok_s"]
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check_in_temp(text: str | bytes) -> tuple[int, str, str]:
    with tempfile.TemporaryDirectory() as directory:
        return check_text(Path(directory), text)


def _assert_judged_or_red(code: int, out: str, err: str) -> None:
    assert code in (0, 4, 5), (code, out, err)
    assert "Traceback" not in out + err
    if code == 4:
        assert out == "" and "witness.json" in err
    else:
        assert out.startswith("shape check ") and err == ""


@FUZZ
@given(JSON_VALUES)
def test_any_json_value_is_judged_or_red(value):
    _assert_judged_or_red(*_check_in_temp(json.dumps(value)))


@FUZZ
@given(st.binary(max_size=200))
def test_any_bytes_are_judged_or_red(data):
    _assert_judged_or_red(*_check_in_temp(data))


@FUZZ
@given(st.sampled_from(WITNESS_KEYS), JSON_VALUES)
def test_any_value_at_a_witness_key_is_judged_or_red(key, value):
    _assert_judged_or_red(*_check_in_temp(json.dumps(mutated(set_top(key, value)))))


@FUZZ
@given(st.integers(0, 3), st.sampled_from(BAND_KEYS), JSON_VALUES)
def test_any_value_at_a_band_key_is_judged_or_red(index, key, value):
    _assert_judged_or_red(*_check_in_temp(json.dumps(mutated(set_band(index, key, value)))))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the file is empty"),
        ("{", "not JSON: "),
        ('{"bands": NaN}', "not JSON: NaN is not a JSON number"),
        ('{"bands": [{"c": 1, "decode_tok_s": Infinity}]}', "not JSON: Infinity is not a JSON number"),
        ("[" * 100_000, "not JSON: nested too deeply"),
        ("1" * 5000, "not JSON: "),
        ("[]", "not a JSON object, got a list"),
        ('"bands"', 'not a JSON object, got "bands"'),
        ('{"bands": {}}', "bands must be a list or null, got an object"),
        ('{"bands": null}', "the witness measured no bands"),
        ('{"bands": [4]}', "bands[0] must be an object, got 4"),
        ('{"bands": [{}]}', "bands[0].c must be a non-negative integer, got null"),
        ('{"bands": [{"c": -1}]}', "bands[0].c must be a non-negative integer, got -1"),
        ('{"bands": [{"c": 4.0}]}', "bands[0].c must be a non-negative integer, got 4.0"),
        ('{"bands": [{"c": true}]}', "bands[0].c must be a non-negative integer, got true"),
        ('{"bands": [{"c": 1}, {"c": 4, "m_formed": "4"}]}', 'bands[1].m_formed must be an integer or null, got "4"'),
        ('{"bands": [{"c": 1, "declared_min": 64.0}]}', "bands[0].declared_min must be an integer or null, got 64.0"),
        ('{"bands": [{"c": 1, "result": 1}]}', "bands[0].result must be a string or null, got 1"),
        ('{"bands": [{"c": 1, "decode_tok_s": "30"}]}', 'bands[0].decode_tok_s must be a number or null, got "30"'),
        (
            '{"bands": [{"c": 1, "top2_margin_at_divergence": false}]}',
            "bands[0].top2_margin_at_divergence must be a number or null, got false",
        ),
        ('{"bands": [{"c": 1, "decode_tok_s": 1e400}]}', "bands[0].decode_tok_s is too large a number: Infinity"),
        ('{"bands": [{"c": 1, "decode_tok_s": ' + "9" * 400 + "}]}", "bands[0].decode_tok_s is too large a number"),
        ('{"bands": [{"c": 1}], "model": "m.gguf"}', 'model must be an object or null, got "m.gguf"'),
        ('{"bands": [{"c": 1}], "model": {"path": 3}}', "model.path must be a string or null, got 3"),
        ('{"bands": [{"c": 1}], "model": {"sha256": []}}', "model.sha256 must be a string or null, got a list"),
        ('{"bands": [{"c": 1}], "host": 7}', "host must be a string or null, got 7"),
        ('{"bands": [{"c": 1}], "commit": ["' + "x" * 60 + '"]}', "commit must be a string or null, got a list"),
    ],
)
def test_parse_refuses_with_a_message_naming_what_is_wrong(text, message):
    with pytest.raises(WitnessError) as raised:
        parse_witness(text)
    assert str(raised.value).startswith(message)


def test_a_long_offending_value_is_cut_short_in_the_message():
    with pytest.raises(WitnessError) as raised:
        parse_witness('{"bands": [{"c": "' + "x" * 100 + '"}]}')
    assert str(raised.value) == 'bands[0].c must be a non-negative integer, got "' + "x" * 36 + "..."


def test_a_value_of_exactly_forty_characters_is_shown_whole():
    value = "y" * 38  # 40 characters with its quotes
    with pytest.raises(WitnessError) as raised:
        parse_witness('{"bands": [{"c": "' + value + '"}]}')
    assert str(raised.value).endswith(f'got "{value}"')


def test_typed_witness_keeps_only_the_judged_keys_and_makes_numbers_floats():
    witness = control()
    witness["bands"][C4]["decode_tok_s"] = 30
    witness["bands"][C4]["top2_margin_at_divergence"] = 0
    typed = typed_witness(witness)
    assert sorted(typed) == sorted(["binary_sha256", "commit", "host", "prompt_sha256", "model", "bands", "fleet",
                                    "fail_open", "reference_logprobs", "stream_parity", "cache"])
    assert typed["fleet"] is None  # a witness without a fleet section
    # ... nor the additions of issue 27: nothing failed open, no mode ran, the reference's logprobs unrecorded.
    assert (typed["fail_open"], typed["stream_parity"], typed["cache"]) == ([], None, None)
    assert typed["reference_logprobs"] is None
    assert typed["model"] == witness["model"]
    band = typed["bands"][C4]
    assert isinstance(band, Band) and band.key_order == tuple(witness["bands"][C4])
    # The band keys the check does not judge read as null: the control records them.
    assert (band.intra_agree_to, band.max_constant_run, band.max_constant_run_declared) == (None, None, None)
    assert witness["bands"][C4]["intra_agree_to"] == 128 and witness["bands"][C4]["max_constant_run"] == 2
    assert (band.c, band.result, band.m_formed, band.divergence_at, band.declared_min) == (4, "PASS", 4, 127, 64)
    assert band.decode_tok_s == 30.0 and isinstance(band.decode_tok_s, float)
    assert band.top2_margin_at_divergence == 0.0 and isinstance(band.top2_margin_at_divergence, float)
    assert typed["bands"][C1].top2_margin_at_divergence is None
    # A slot keeps its judged keys only.
    assert sorted(band.slots[0]) == sorted(["i", "divergence_at", "top2_margin_at_divergence", "logprob_max_abs_diff",
                                            "logprobs_bitwise_equal", "logprob_first_diff_at", "replica"])


def test_a_band_at_c0_is_read_and_ignored(tmp_path):
    witness = control()
    witness["bands"].append({"c": 0, "result": "FAIL"})
    assert check_witness(tmp_path, witness) == (0, [])


def test_integer_rates_are_read_as_numbers(tmp_path):
    witness = mutated(set_band(C1, "decode_tok_s", 40), set_band(C4, "decode_tok_s", 20))
    assert check_witness(tmp_path, witness) == (0, [])


def test_bytes_that_are_not_utf8_exit_4(tmp_path):
    code, out, err = check_text(tmp_path, b'{"bands": "\xff"}')
    assert (code, out) == (4, "")
    assert "not UTF-8 text" in err


def test_a_byte_order_mark_is_not_json(tmp_path):
    code, _, err = check_text(tmp_path, "\ufeff" + json.dumps(control()))
    assert code == 4
    assert "not JSON" in err


def test_a_missing_path_exits_3_before_reading(tmp_path):
    missing = tmp_path / "absent.json"
    code, out, err = run_cli(["check", str(missing)])
    assert (code, out) == (3, "")
    assert err == f"shape check: witness {missing}: not a regular file\n"


def test_a_directory_exits_3(tmp_path):
    code, _, err = run_cli(["check", str(tmp_path)])
    assert code == 3
    assert "not a regular file" in err


def test_a_file_that_fails_to_read_exits_4(tmp_path, monkeypatch):
    path = tmp_path / "witness.json"
    path.write_text(json.dumps(control()), encoding="utf-8")

    read_bytes = Path.read_bytes

    def fail(self):
        if self == path:
            raise OSError(errno.EIO, "Input/output error")
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", fail)
    code, out, err = run_cli(["check", str(path)])
    assert (code, out) == (4, "")
    assert err == f"shape check: witness {path}: unreadable (Input/output error)\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_exits_4(tmp_path):
    path = tmp_path / "witness.json"
    path.write_text(json.dumps(control()), encoding="utf-8")
    path.chmod(0)
    code, out, err = run_cli(["check", str(path)])
    assert (code, out) == (4, "")
    assert err == f"shape check: witness {path}: unreadable (Permission denied)\n"


def test_a_value_of_forty_one_characters_is_cut_short():
    value = "z" * 39  # 41 characters with its quotes
    with pytest.raises(WitnessError) as raised:
        parse_witness('{"bands": [{"c": "' + value + '"}]}')
    assert str(raised.value).endswith('got "' + "z" * 36 + "...")
