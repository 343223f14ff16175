"""Every row of the shape check's case table (spec/shape-check.md), with its exact reasons."""

import pytest

from tests.helpers.check_support import (
    C1,
    C4,
    C8,
    C16,
    append_band,
    check_text,
    check_witness,
    del_band_key,
    del_top,
    diverge,
    drop_band,
    duplicate_band,
    mutated,
    set_band,
    set_top,
)

S1_PREFIX = 'S1: model "{}" does not start with a blessed prefix (smollm2-135m-instruct)'
NO_MARGIN = "S5: c=4 diverges from m=1 at {} < declared_min 64 with no top-2 margin recorded"
NOT_NEAR_TIE = (
    "S5: c=4 diverges from m=1 at 3 < declared_min 64; its top-2 margin {} is not a near-tie "
    "(needs 0 <= margin < 0.05)"
)
CAP = (
    "near-tie cap: {} batched bands ({}) are admitted only by a near-tie margin; "
    "the contract allows 1"
)
UNMEASURED = "S7 unmeasured at {} (no positive decode_tok_s)"

# (id, mutations, exit code, exact reasons). An exit of 4 has no reasons to compare.
CASES = [
    ("control", [], 0, []),
    ("c4 near-tie 0.01", [diverge(C4, 3, 0.01)], 0, []),
    ("c16 m_formed 14", [set_band(C16, "m_formed", 14)], 5, ["S3: c=16 m_formed 14 != c (the shape was not served)"]),
    (
        "model not blessed",
        [lambda w: w["model"].update(path="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")],
        5,
        [S1_PREFIX.format("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")],
    ),
    ("c4 diverges at 3, no margin", [diverge(C4, 3)], 5, [NO_MARGIN.format(3)]),
    ("no binary_sha256", [del_top("binary_sha256")], 5, ["S4: identity field binary_sha256 missing"]),
    ("no commit", [del_top("commit")], 5, ["S4: identity field commit missing"]),
    ("no host", [del_top("host")], 5, ["S4: identity field host missing"]),
    ("no prompt_sha256", [del_top("prompt_sha256")], 5, ["S4: identity field prompt_sha256 missing"]),
    ("no model sha256", [lambda w: w["model"].pop("sha256")], 5, ["S1: model sha256 missing"]),
    ("margin exactly eps", [diverge(C4, 3, 0.05)], 5, [NOT_NEAR_TIE.format("0.05")]),
    ("margin 0.0499", [diverge(C4, 3, 0.0499)], 0, []),
    ("margin 0", [diverge(C4, 3, 0)], 0, []),
    ("margin -0.01", [diverge(C4, 3, -0.01)], 5, [NOT_NEAR_TIE.format("-0.01")]),
    ("c8 FAIL", [set_band(C8, "result", "FAIL")], 5, ["S6: c=8 result FAIL is not PASS"]),
    ("c1 removed", [drop_band(C1)], 5, ["band c=1 not measured"]),
    ("c4 removed", [drop_band(C4)], 5, ["band c=4 not measured"]),
    ("c8 removed", [drop_band(C8)], 5, ["band c=8 not measured"]),
    ("c16 removed", [drop_band(C16)], 5, ["band c=16 not measured"]),
    ("divergence_at 64", [diverge(C4, 64)], 0, []),
    ("divergence_at 63", [diverge(C4, 63)], 5, [NO_MARGIN.format(63)]),
    ("bands []", [set_top("bands", [])], 4, None),
    (
        "c8 UNMEASURABLE, divergence_at null",
        [set_band(C8, "result", "UNMEASURABLE"), set_band(C8, "divergence_at", None)],
        5,
        ["S6: c=8 result UNMEASURABLE is not PASS"],
    ),
    ("m_formed true", [set_band(C1, "m_formed", True)], 4, None),
    ("margin false", [diverge(C4, 3, False)], 4, None),
    ('c "4"', [set_band(C4, "c", "4")], 4, None),
    ('decode_tok_s "30"', [set_band(C4, "decode_tok_s", "30")], 4, None),
    (
        "no declared_min",
        [del_band_key(C4, "declared_min")],
        5,
        ["S5: c=4 declared_min not recorded, so agreement with m=1 cannot be checked"],
    ),
    (
        "c8 twice, FAIL copy first",
        [duplicate_band(C8, result="FAIL")],
        5,
        ["band c=8 recorded 2 times; a witness has one band per c", "S6: c=8 result FAIL is not PASS"],
    ),
    (
        "prefix, not substring",
        [lambda w: w["model"].update(path="not-smollm2-135m-instruct.gguf")],
        5,
        [S1_PREFIX.format("not-smollm2-135m-instruct.gguf")],
    ),
    (
        "PASS band, divergence_at null",
        [set_band(C16, "divergence_at", None)],
        5,
        ["S5: c=16 divergence_at not recorded on a PASS band, so agreement with m=1 is unmeasured"],
    ),
    ("m_formed null", [set_band(C4, "m_formed", None)], 5, ["S3: c=4 m_formed not recorded (the shape is not shown)"]),
    ("result missing", [del_band_key(C1, "result")], 5, ["S6: c=1 result not recorded"]),
    ('host "  "', [set_top("host", "  ")], 5, ["S4: identity field host missing"]),
    ("model removed", [del_top("model")], 5, [S1_PREFIX.format(""), "S1: model sha256 missing"]),
    ("extra c=2 FAIL", [append_band(C1, c=2, m_formed=2, result="FAIL")], 0, []),
    (
        "c4 rate 19.6",
        [set_band(C4, "decode_tok_s", 19.6)],
        5,
        ["S7: decode at c=4 is 19.6 tok/s, 49.0% of c=1's 40.0 tok/s; the contract needs at least 50%"],
    ),
    ("c4 rate 20.0", [set_band(C4, "decode_tok_s", 20.0)], 0, []),
    ("c8/c16 rates 1.0", [set_band(C8, "decode_tok_s", 1.0), set_band(C16, "decode_tok_s", 1.0)], 0, []),
    ("c4 rate removed", [del_band_key(C4, "decode_tok_s")], 5, [UNMEASURED.format("c=4")]),
    ("c1 rate null", [set_band(C1, "decode_tok_s", None)], 5, [UNMEASURED.format("c=1")]),
    (
        "both rates 0.0",
        [set_band(C1, "decode_tok_s", 0.0), set_band(C4, "decode_tok_s", 0.0)],
        5,
        [UNMEASURED.format("c=1 and c=4")],
    ),
    (
        "c1 removed, c4 rate null",
        [set_band(C4, "decode_tok_s", None), drop_band(C1)],
        5,
        ["band c=1 not measured"],
    ),
    ("near-tie c4 and c8", [diverge(C4, 3, 0.01), diverge(C8, 3, 0.01)], 5, [CAP.format(2, "c=4, c=8")]),
    (
        "near-tie c4, c8 and c16",
        [diverge(C4, 3, 0.01), diverge(C8, 3, 0.01), diverge(C16, 3, 0.01)],
        5,
        [CAP.format(3, "c=4, c=8, c=16")],
    ),
    ("near-tie c16 alone", [diverge(C16, 3, 0.01)], 0, []),
    ("near-tie c1 and c4", [diverge(C1, 3, 0.01), diverge(C4, 3, 0.01)], 0, []),
    ("c4 at 64 with a margin, c8 near-tie", [diverge(C4, 64, 0.01), diverge(C8, 3, 0.01)], 0, []),
    (
        "declared_min 1, diverges at 3",
        [set_band(C4, "declared_min", 1), diverge(C4, 3)],
        5,
        ["floor: c=4 declared_min 1 is below the contract's floor 64"],
    ),
    (
        "declared_min 63",
        [set_band(C8, "declared_min", 63)],
        5,
        ["floor: c=8 declared_min 63 is below the contract's floor 64"],
    ),
]


@pytest.mark.parametrize(("mutations", "exit_code", "reasons"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_case_row_exits_as_the_spec_says(tmp_path, mutations, exit_code, reasons):
    code, got = check_witness(tmp_path, mutated(*mutations))
    assert code == exit_code
    if reasons is not None:
        assert got == reasons


def test_case_ids_are_unique():
    ids = [case[0] for case in CASES]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("text", ["", "\n", "  \t\n", "{", "[]", "3", "null", '{"bands": 4}', "{}"])
def test_unreadable_witness_text_exits_4_and_names_the_file(tmp_path, text):
    code, out, err = check_text(tmp_path, text)
    assert code == 4
    assert out == ""
    assert str(tmp_path / "witness.json") in err
    assert "Traceback" not in err


def test_an_object_without_bands_says_no_bands(tmp_path):
    code, _, err = check_text(tmp_path, "{}")
    assert code == 4
    assert "the witness measured no bands" in err
