"""The serving-shape parity contract: the shipped file, and strict refusal of a bad one."""

import errno
import json
from importlib import resources

import pytest
import yaml

import batchproof.check.contract as contract_module
from batchproof.check.contract import (
    BlessedModel,
    Contract,
    ContractError,
    contract_from_mapping,
    contract_from_text,
    load_contract,
    shipped_contract_text,
)
from tests.helpers.check_support import check_text, control, run_cli

SMOLLM_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def valid() -> dict:
    return yaml.safe_load(shipped_contract_text())


def test_the_shipped_contract_holds_the_spec_values():
    assert load_contract() == Contract(
        blessed_models=(BlessedModel("smollm2-135m-instruct", SMOLLM_SHA),),
        bands=(1, 4, 8, 16),
        near_tie_eps=0.05,
        near_tie_cap=1,
        declared_min_floor=64,
        decode_ratio_c4_over_c1=0.5,
        require_bitwise_logprobs=True,
        require_stable_reference=True,
    )


def test_the_floor_is_the_probe_matrix_min_agree_tokens():
    # A witness must not set its own bar: the floor is the shipped matrix's declared_min.
    shipped = resources.files("batchproof.probe").joinpath("perf-matrix.yaml")
    matrix = yaml.safe_load(shipped.read_text(encoding="utf-8"))
    assert load_contract().declared_min_floor == matrix["witness"]["min_agree_tokens"]


def test_a_contract_file_is_read_from_its_path(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(shipped_contract_text().replace("near_tie_cap: 1", "near_tie_cap: 2"), encoding="utf-8")
    assert load_contract(path).near_tie_cap == 2


def _without(key: str) -> dict:
    raw = valid()
    del raw[key]
    return raw


def _with(key: str, value: object) -> dict:
    raw = valid()
    raw[key] = value
    return raw


def _model(**fields: object) -> dict:
    return _with("blessed_models", [fields])


BAD = [
    (_without("bands"), "bands: is missing"),
    (_without("blessed_models"), "blessed_models: is missing"),
    (_without("decode_ratio_c4_over_c1"), "decode_ratio_c4_over_c1: is missing"),
    (_with("near_tie_esp", 0.05), "near_tie_esp: is not a contract key"),
    (_with("bands", []), "bands: must list positive integers, got ()"),
    (_with("bands", "1,4"), "bands: must list positive integers, got '1,4'"),
    (_with("bands", [1, 0]), "bands: must list positive integers, got (1, 0)"),
    (_with("bands", [1, True]), "bands: must list positive integers, got (1, True)"),
    (_with("bands", [1, 4.0]), "bands: must list positive integers, got (1, 4.0)"),
    (_with("bands", [1, 4, 4]), "bands: lists a band twice: (1, 4, 4)"),
    (_with("near_tie_eps", -0.01), "near_tie_eps: must be a finite number >= 0, got -0.01"),
    (_with("near_tie_eps", "0.05"), "near_tie_eps: must be a finite number >= 0, got '0.05'"),
    (_with("near_tie_eps", float("inf")), "near_tie_eps: must be a finite number >= 0, got inf"),
    (_with("near_tie_eps", None), "near_tie_eps: must be a finite number >= 0, got None"),
    (_with("decode_ratio_c4_over_c1", -1), "decode_ratio_c4_over_c1: must be a finite number >= 0, got -1"),
    (_with("decode_ratio_c4_over_c1", True), "decode_ratio_c4_over_c1: must be a finite number >= 0, got True"),
    (_with("near_tie_cap", -1), "near_tie_cap: must be an integer >= 0, got -1"),
    (_with("near_tie_cap", True), "near_tie_cap: must be an integer >= 0, got True"),
    (_with("near_tie_cap", 1.0), "near_tie_cap: must be an integer >= 0, got 1.0"),
    (_with("declared_min_floor", -64), "declared_min_floor: must be an integer >= 0, got -64"),
    (_with("declared_min_floor", "64"), "declared_min_floor: must be an integer >= 0, got '64'"),
    (_with("blessed_models", []), "blessed_models: must list at least one model, got ()"),
    (_with("blessed_models", "smollm2"), "blessed_models: must list at least one model, got 'smollm2'"),
    (_with("blessed_models", ["smollm2"]), "blessed_models[0]: must be a mapping, got 'smollm2'"),
    (_model(sha256=SMOLLM_SHA), "blessed_models[0].prefix: is missing"),
    (_model(prefix="  "), "blessed_models[0].prefix: must be a non-empty string, got '  '"),
    (_model(prefix=7), "blessed_models[0].prefix: must be a non-empty string, got 7"),
    (_model(prefix="m", sha256="abc"), "blessed_models[0].sha256: must be 64 hex digits, got 'abc'"),
    (_model(prefix="m", sha256="g" * 64), "blessed_models[0].sha256: must be 64 hex digits, got '" + "g" * 64 + "'"),
    (_model(prefix="m", sha256="a" * 65), "blessed_models[0].sha256: must be 64 hex digits, got '" + "a" * 65 + "'"),
    (_model(prefix="m", name="x"), "blessed_models[0].name: is not a contract key"),
    ([1, 2], "(the document): must be a mapping, got [1, 2]"),
    (None, "(the document): must be a mapping, got None"),
]


@pytest.mark.parametrize(("raw", "message"), BAD)
def test_a_bad_contract_is_refused_naming_the_key(raw, message):
    with pytest.raises(ContractError) as raised:
        contract_from_mapping(raw)
    assert str(raised.value) == message


def test_a_blessed_model_sha256_may_be_null_or_absent():
    assert contract_from_mapping(_model(prefix="m", sha256=None)).blessed_models == (BlessedModel("m"),)
    assert contract_from_mapping(_model(prefix="m")).blessed_models == (BlessedModel("m", None),)


def test_a_contract_error_keeps_its_key_and_problem():
    error = ContractError("prefix", "is missing").under("blessed_models[2]")
    assert (error.key, error.problem) == ("blessed_models[2].prefix", "is missing")


def test_the_dataclass_refuses_a_list_where_a_tuple_is_due():
    with pytest.raises(ContractError) as raised:
        Contract([BlessedModel("m")], (1,), 0.05, 1, 64, 0.5)
    assert raised.value.key == "blessed_models"
    with pytest.raises(ContractError) as raised:
        Contract(("m",), (1,), 0.05, 1, 64, 0.5)
    assert str(raised.value) == "blessed_models: must hold BlessedModel entries"


def test_zero_is_a_valid_eps_cap_floor_and_ratio():
    contract = Contract((BlessedModel("m"),), (1,), 0, 0, 0, 0)
    assert (contract.near_tie_eps, contract.near_tie_cap, contract.declared_min_floor) == (0, 0, 0)


def test_yaml_that_does_not_parse_is_refused():
    with pytest.raises(ContractError) as raised:
        contract_from_text("bands: [1, 4\n")
    assert str(raised.value).startswith("(the document): is not YAML (")


def test_the_cli_refuses_a_bad_contract_with_exit_4_naming_the_key(tmp_path):
    contract = tmp_path / "bad.yaml"
    contract.write_text(shipped_contract_text().replace("near_tie_eps: 0.05", "near_tie_eps: -0.05"), encoding="utf-8")
    code, out, err = check_text(tmp_path, "{}", "--contract", str(contract))
    assert (code, out) == (4, "")
    assert err == f"shape check: contract {contract}: near_tie_eps: must be a finite number >= 0, got -0.05\n"


def test_the_cli_refuses_a_contract_that_is_not_utf8(tmp_path):
    contract = tmp_path / "bad.yaml"
    contract.write_bytes(b"bands: [1]\n\xff\n")
    code, _, err = check_text(tmp_path, "{}", "--contract", str(contract))
    assert code == 4
    assert err.startswith(f"shape check: contract {contract}: unreadable (")


def test_a_missing_contract_path_exits_3_before_the_witness_is_read(tmp_path):
    missing = tmp_path / "absent.yaml"
    code, _, err = check_text(tmp_path, "not json at all", "--contract", str(missing))
    assert code == 3
    assert err == f"shape check: contract {missing}: not a regular file\n"


def test_the_witness_path_is_checked_before_the_contract_path(tmp_path):
    code, _, err = run_cli(["check", str(tmp_path / "w.json"), "--contract", str(tmp_path / "c.yaml")])
    assert code == 3
    assert "witness" in err and "contract" not in err


def test_the_contract_is_loaded_before_the_witness_is_read(tmp_path):
    contract = tmp_path / "bad.yaml"
    contract.write_text("bands: [1]\n", encoding="utf-8")
    code, _, err = check_text(tmp_path, "{", "--contract", str(contract))
    assert code == 4
    assert err == f"shape check: contract {contract}: blessed_models: is missing\n"


def test_a_contract_without_sha256_accepts_any_model_sha(tmp_path):
    contract = tmp_path / "c.yaml"
    contract.write_text(shipped_contract_text().replace(f"sha256: {SMOLLM_SHA}", ""), encoding="utf-8")
    witness = control()
    witness["model"]["sha256"] = "d" * 64
    code, out, _ = check_text(tmp_path, json.dumps(witness), "--contract", str(contract))
    assert code == 0
    assert out.endswith(": ADMISSIBLE\n")


def test_a_sha256_may_use_every_hex_digit_in_either_case():
    sha = ("0123456789abcdefABCDEF" * 3)[:64]
    assert contract_from_mapping(_model(prefix="m", sha256=sha)).blessed_models == (BlessedModel("m", sha),)


def test_a_broken_shipped_contract_is_named_as_the_shipped_one(tmp_path, monkeypatch):
    monkeypatch.setattr(contract_module, "shipped_contract_text", lambda: "bands: [1]\n")
    code, out, err = check_text(tmp_path, json.dumps(control()))
    assert (code, out) == (4, "")
    assert err == "shape check: contract shipped: blessed_models: is missing\n"


def test_a_contract_file_is_utf8_whatever_the_locale(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(shipped_contract_text().replace("smollm2-135m-instruct", "smøllm2").encode("utf-8"))
    assert load_contract(path).blessed_models[0].prefix == "smøllm2"


def test_a_shipped_contract_that_cannot_be_read_is_named_as_the_shipped_one(tmp_path, monkeypatch):
    def fail() -> str:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(contract_module, "shipped_contract_text", fail)
    code, _, err = check_text(tmp_path, json.dumps(control()))
    assert code == 4
    assert err == "shape check: contract shipped: unreadable ([Errno 5] Input/output error)\n"
