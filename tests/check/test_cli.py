"""`batchproof check`: its output, --json, aprender's witnesses, S1 details, and no torch."""

import dataclasses
import json
import subprocess
import sys

import pytest

from batchproof.check.contract import BlessedModel, Contract, load_contract
from batchproof.check.rules import judge
from batchproof.check.witness import typed_witness
from batchproof.cli import main
from tests.helpers.check_support import (
    APRENDER_CONTRACT,
    C4,
    C8,
    C16,
    FIXTURES,
    append_band,
    check_text,
    check_witness,
    control,
    diverge,
    duplicate_band,
    mutated,
    run_cli,
    set_band,
)

SMOLLM_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def _contract(**changes: object) -> Contract:
    fields = {**load_contract().__dict__, **changes}
    return Contract(**fields)


def _reasons(witness: dict, contract: Contract | None = None) -> list[str]:
    return judge(typed_witness(witness), contract or load_contract())


def test_admissible_output_is_one_line(tmp_path):
    code, out, err = check_text(tmp_path, json.dumps(control()))
    assert (code, err) == (0, "")
    assert out == f"shape check {tmp_path / 'witness.json'}: ADMISSIBLE\n"


def test_not_admissible_output_lists_every_reason(tmp_path):
    witness = mutated(set_band(C8, "result", "FAIL"), set_band(C16, "m_formed", 14))
    code, out, err = check_text(tmp_path, json.dumps(witness))
    assert (code, err) == (5, "")
    assert out == (
        f"shape check {tmp_path / 'witness.json'}: NOT ADMISSIBLE\n"
        "  - S6: c=8 result FAIL is not PASS\n"
        "  - S3: c=16 m_formed 14 != c (the shape was not served)\n"
    )


def test_json_output_admissible(tmp_path):
    code, out, _ = check_text(tmp_path, json.dumps(control()), "--json")
    assert code == 0
    assert json.loads(out) == {"verdict": "ADMISSIBLE", "reasons": []}
    assert out.count("\n") == 1


def test_json_output_not_admissible(tmp_path):
    code, out, _ = check_text(tmp_path, json.dumps(mutated(set_band(C8, "result", "FAIL"))), "--json")
    assert code == 5
    assert json.loads(out) == {"verdict": "NOT ADMISSIBLE", "reasons": ["S6: c=8 result FAIL is not PASS"]}


def test_json_output_on_red_is_one_line_and_the_exit_code_stays(tmp_path):
    code, out, err = check_text(tmp_path, "{}", "--json")
    assert code == 4
    message = f"witness {tmp_path / 'witness.json'}: the witness measured no bands"
    assert json.loads(out) == {"verdict": "RED", "reasons": [message]}
    assert err == f"shape check: {message}\n"


def test_aprender_v3_is_judged_by_aprender_contract(tmp_path):
    code, out, _ = run_cli(["check", str(FIXTURES / "aprender-v3.json"), "--contract", str(APRENDER_CONTRACT),
                            "--json"])
    assert (code, json.loads(out)) == (0, {"verdict": "ADMISSIBLE", "reasons": []})


def test_aprender_v3_is_not_our_blessed_model():
    code, out, _ = run_cli(["check", str(FIXTURES / "aprender-v3.json"), "--json"])
    assert code == 5
    # Our contract also asks for bitwise logprobs, which aprender's v3 does not record.
    need = "logprob parity with m=1 not recorded; the contract requires logprobs bitwise equal to m=1's"
    assert json.loads(out)["reasons"] == [
        'S1: model "Qwen3.5-4B-Q4_K_M.gguf" does not start with a blessed prefix (smollm2-135m-instruct)',
        *(f"logprobs: c={c} {need}" for c in (1, 4, 8, 16)),
    ]


def test_aprender_v2_is_read_but_cannot_show_s7():
    # v2 has no decode_tok_s: read, judged, and not admissible because S7 is unmeasured.
    code, out, _ = run_cli(["check", str(FIXTURES / "aprender-v2.json"), "--contract", str(APRENDER_CONTRACT),
                            "--json"])
    assert code == 5
    assert json.loads(out)["reasons"] == ["S7 unmeasured at c=1 and c=4 (no positive decode_tok_s)"]


def test_aprender_v2_has_no_margin_so_an_early_divergence_is_unexplained():
    witness = json.loads((FIXTURES / "aprender-v2.json").read_text(encoding="utf-8"))
    witness["bands"][C4]["divergence_at"] = 3
    contract = _contract(blessed_models=(BlessedModel("qwen3.5-4b"),), require_bitwise_logprobs=False)
    assert _reasons(witness, contract) == [
        "S5: c=4 diverges from m=1 at 3 < declared_min 64 with no top-2 margin recorded",
        "S7 unmeasured at c=1 and c=4 (no positive decode_tok_s)",
    ]


def test_aprender_v3_typed_reading_keeps_its_margin():
    witness = json.loads((FIXTURES / "aprender-v3.json").read_text(encoding="utf-8"))
    band = typed_witness(witness)["bands"][C8]
    assert (band.divergence_at, band.top2_margin_at_divergence, band.decode_tok_s) == (41, 0.0125, 33.25)


def test_a_differing_model_sha256_is_named():
    witness = control()
    witness["model"]["sha256"] = "e" * 64
    assert _reasons(witness) == [f"S1: model sha256 {'e' * 64} is not the blessed {SMOLLM_SHA}"]


def test_sha256_and_prefix_compare_without_ascii_case():
    witness = control()
    witness["model"] = {"path": "SmolLM2-135M-Instruct-Q8_0.gguf", "sha256": f" {SMOLLM_SHA.upper()} "}
    assert _reasons(witness) == []


def test_the_prefix_folds_only_ascii_case():
    # U+212A KELVIN SIGN lower-cases to "k" under str.lower(); the contract's match is ASCII only.
    witness = control()
    witness["model"]["path"] = "\u212aelvin-1b.gguf"
    contract = _contract(blessed_models=(BlessedModel("kelvin"),))
    expected = 'S1: model "\\u212aelvin-1b.gguf" does not start with a blessed prefix (kelvin)'
    assert _reasons(witness, contract) == [expected]


def test_a_blank_model_sha256_is_missing():
    witness = control()
    witness["model"]["sha256"] = " \t"
    assert _reasons(witness) == ["S1: model sha256 missing"]


def test_a_model_with_null_fields_gives_both_s1_reasons():
    witness = control()
    witness["model"] = {"path": None, "sha256": None}
    assert _reasons(witness) == [
        'S1: model "" does not start with a blessed prefix (smollm2-135m-instruct)',
        "S1: model sha256 missing",
    ]


def test_any_matching_blessed_entry_admits_its_sha():
    contract = _contract(
        blessed_models=(
            BlessedModel("other-model", "f" * 64),
            BlessedModel("smollm2-135m-instruct", "a" * 64),
            BlessedModel("smollm2-135m", SMOLLM_SHA),
        )
    )
    assert _reasons(control(), contract) == []
    witness = control()
    witness["model"]["sha256"] = "b" * 64
    assert _reasons(witness, contract) == [f"S1: model sha256 {'b' * 64} is not the blessed {'a' * 64} or {SMOLLM_SHA}"]


def test_an_unblessed_model_lists_every_prefix_and_no_sha_reason():
    contract = _contract(blessed_models=(BlessedModel("a-model", SMOLLM_SHA), BlessedModel("b-model")))
    witness = control()
    witness["model"]["sha256"] = "0" * 64
    assert _reasons(witness, contract) == [
        'S1: model "smollm2-135m-instruct-q8_0.gguf" does not start with a blessed prefix (a-model, b-model)'
    ]


def test_reasons_come_in_the_spec_order():
    witness = mutated(
        set_band(C4, "decode_tok_s", 1.0),
        diverge(C8, 3, 0.01),
        diverge(C16, 3, 0.01),
        set_band(C8, "m_formed", 7),
        duplicate_band(C4, result="FAIL"),
    )
    witness["model"]["path"] = "other.gguf"
    witness["host"] = None
    assert _reasons(witness) == [
        'S1: model "other.gguf" does not start with a blessed prefix (smollm2-135m-instruct)',
        "S4: identity field host missing",
        "band c=4 recorded 2 times; a witness has one band per c",
        "S6: c=4 result FAIL is not PASS",
        "S3: c=8 m_formed 7 != c (the shape was not served)",
        "near-tie cap: 2 batched bands (c=8, c=16) are admitted only by a near-tie margin; the contract allows 1",
    ]


def test_one_copy_reports_s6_s3_floor_and_s5_in_that_order():
    witness = mutated(
        set_band(C4, "result", "FAIL"),
        set_band(C4, "m_formed", 2),
        set_band(C4, "declared_min", 32),
        diverge(C4, 3),
    )
    assert _reasons(witness) == [
        "S6: c=4 result FAIL is not PASS",
        "S3: c=4 m_formed 2 != c (the shape was not served)",
        "floor: c=4 declared_min 32 is below the contract's floor 64",
        "S5: c=4 diverges from m=1 at 3 < declared_min 32 with no top-2 margin recorded",
    ]


def test_a_non_pass_band_without_divergence_at_has_only_its_result_reason():
    witness = mutated(set_band(C4, "result", None), set_band(C4, "divergence_at", None))
    assert _reasons(witness) == ["S6: c=4 result not recorded"]


def test_duplicate_near_tie_copies_each_count_towards_the_cap():
    witness = mutated(diverge(C8, 3, 0.01), duplicate_band(C8))
    assert _reasons(witness) == [
        "band c=8 recorded 2 times; a witness has one band per c",
        "near-tie cap: 2 batched bands (c=8, c=8) are admitted only by a near-tie margin; the contract allows 1",
    ]


def test_a_cap_of_zero_refuses_a_single_near_tie():
    reasons = _reasons(mutated(diverge(C16, 3, 0.01)), _contract(near_tie_cap=0))
    assert reasons == [
        "near-tie cap: 1 batched bands (c=16) are admitted only by a near-tie margin; the contract allows 0"
    ]


def test_a_near_tie_at_c2_counts_when_the_contract_has_c2():
    witness = mutated(append_band(C4, c=2, m_formed=2), diverge(C4, 3, 0.01))
    witness["bands"][-1].update(divergence_at=3, top2_margin_at_divergence=0.01)
    assert _reasons(witness, _contract(bands=(1, 2, 4, 8, 16))) == [
        "near-tie cap: 2 batched bands (c=2, c=4) are admitted only by a near-tie margin; the contract allows 1"
    ]


@pytest.mark.parametrize("missing", ["declared_min", "divergence_at"])
def test_a_margin_without_declared_min_or_divergence_at_is_no_near_tie(missing):
    witness = mutated(diverge(C8, 3, 0.01), diverge(C16, 3, 0.01), set_band(C8, missing, None))
    reason = {
        "declared_min": "S5: c=8 declared_min not recorded, so agreement with m=1 cannot be checked",
        "divergence_at": "S5: c=8 divergence_at not recorded on a PASS band, so agreement with m=1 is unmeasured",
    }[missing]
    assert _reasons(witness) == [reason]


def test_check_usage_and_help_text(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exited:
        main(["check", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: batchproof check [-h] [--contract FILE] [--json] WITNESS.json\n")
    assert "  WITNESS.json     the witness `batchproof probe` wrote\n" in out
    assert "  --contract FILE  a contract YAML to judge by (default: the shipped serving-shape-parity.yaml)\n" in out
    assert '  --json           print {"verdict": ..., "reasons": [...]}\n' in out


def test_a_near_tie_outside_the_contract_bands_is_not_counted():
    witness = mutated(diverge(C8, 3, 0.01), diverge(C16, 3, 0.01))
    assert _reasons(witness, _contract(bands=(1, 4, 8))) == []


def test_a_contract_floor_of_zero_admits_a_declared_min_of_zero():
    witness = mutated(set_band(C4, "declared_min", 0), set_band(C4, "divergence_at", 0))
    assert _reasons(witness, _contract(declared_min_floor=0)) == []
    assert _reasons(witness) == ["floor: c=4 declared_min 0 is below the contract's floor 64"]


def test_the_eps_and_ratio_come_from_the_contract():
    witness = mutated(diverge(C4, 3, 0.07), set_band(C4, "decode_tok_s", 30.0))
    assert _reasons(witness, _contract(near_tie_eps=0.1)) == []
    assert _reasons(witness, _contract(near_tie_eps=0.1, decode_ratio_c4_over_c1=0.8)) == [
        "S7: decode at c=4 is 30.0 tok/s, 75.0% of c=1's 40.0 tok/s; the contract needs at least 80%"
    ]


def test_s7_is_not_read_beside_a_doubled_c4():
    witness = mutated(set_band(C4, "decode_tok_s", None), duplicate_band(C4))
    assert _reasons(witness) == ["band c=4 recorded 2 times; a witness has one band per c"]


def test_a_negative_rate_is_no_rate():
    assert _reasons(mutated(set_band(C4, "decode_tok_s", -30.0))) == [
        "S7 unmeasured at c=4 (no positive decode_tok_s)"
    ]


def test_a_tiny_positive_rate_is_a_rate():
    reasons = _reasons(mutated(set_band(C4, "decode_tok_s", 5e-324)))
    # Rounded to what it means, but never to a zero: the rate keeps its three significant digits.
    assert reasons == ["S7: decode at c=4 is 4.94e-324 tok/s, 0.0% of c=1's 40.0 tok/s; "
                       "the contract needs at least 50%"]


def test_judge_does_not_change_its_inputs():
    witness = typed_witness(mutated(diverge(C4, 3, 0.01)))
    before = json.dumps(witness, sort_keys=True, default=dataclasses.asdict)
    judge(witness, load_contract())
    assert json.dumps(witness, sort_keys=True, default=dataclasses.asdict) == before


def test_the_check_imports_neither_torch_nor_numpy():
    # A fresh interpreter, so nothing another test imported can hide an import.
    script = (
        "import argparse, sys\n"
        "import batchproof.commands.check as check\n"
        "parser = argparse.ArgumentParser()\n"
        "check.add_arguments(parser)\n"
        f"code = check.run(parser.parse_args([{str(FIXTURES / 'control.json')!r}]))\n"
        "assert code == 0, code\n"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_the_control_fixture_is_admissible_through_a_subprocess(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "batchproof", "check", str(FIXTURES / "control.json")],
        capture_output=True,
        text=True,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.endswith("control.json: ADMISSIBLE\n")


def test_an_unknown_key_is_ignored(tmp_path):
    witness = control()
    witness["future_key"] = {"anything": [1, 2]}
    witness["bands"][C4]["future_band_key"] = "x"
    assert check_witness(tmp_path, witness) == (0, [])
