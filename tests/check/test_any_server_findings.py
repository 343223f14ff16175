"""The check's reading of issue 27's additions: the m=1 reference's logprob stability (an optional
clause, on in ours), fail-open replies (whatever the contract, even with no band), and the --cache
and --stream-parity sections' findings."""

import pytest
import yaml

from batchproof.check.contract import ContractError, contract_from_text, load_contract, shipped_contract_text
from tests.helpers.check_support import APRENDER_CONTRACT, C8, check_text, check_witness, control

UNSTABLE = "reference: logprobs of two alone runs differ by 0.566 at token 0"
FAIL_OPEN = {"route": "/v1/chat/completions", "streamed": True, "requests": 2, "what": "HTTP 200 without logprobs"}


def unstable_reference(witness: dict) -> dict:
    """As llama-server -np 16 measured: two alone runs agree on every token but not on logprobs,
    so every band's logprobs differ from the first run's and none of it is batching's."""
    witness["reference_logprobs"] = {"logprobs_stable": False, "logprob_reason": UNSTABLE}
    for band in witness["bands"]:
        band |= {"logprobs_bitwise_equal": False, "logprob_max_abs_diff": 0.566, "logprobs_attributable": False}
    return witness


def contract_file(tmp_path, **changes: object) -> str:
    raw = yaml.safe_load(shipped_contract_text()) | changes
    path = tmp_path / "contract.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_the_clause_is_on_in_ours_and_absent_means_off() -> None:
    assert load_contract().require_stable_reference is True
    assert load_contract(APRENDER_CONTRACT).require_stable_reference is False
    raw = yaml.safe_load(shipped_contract_text()) | {"require_stable_reference": "no"}
    with pytest.raises(ContractError, match="require_stable_reference: must be true or false"):
        contract_from_text(yaml.safe_dump(raw))


def test_an_unstable_reference_is_named_once_and_no_band_is_blamed(tmp_path) -> None:
    assert check_witness(tmp_path, unstable_reference(control())) == (
        5, [f"{UNSTABLE}; the contract does not admit an unstable reference"])


def test_without_the_clause_band_differences_are_labelled_not_batchings(tmp_path) -> None:
    code, reasons = check_witness(tmp_path, unstable_reference(control()), "--contract",
                                  contract_file(tmp_path, require_stable_reference=False))
    assert code == 5 and len(reasons) == 4
    assert reasons[1] == ("logprobs: c=4 logprobs differ from m=1 by up to 0.566; not attributable to batching "
                          "(the m=1 reference's own runs differ); the contract requires logprobs bitwise equal "
                          "to m=1's")


def test_aprenders_contract_admits_an_unstable_reference(tmp_path) -> None:
    witness = unstable_reference(control())
    witness["model"]["path"] = "qwen3.5-4b-q4.gguf"
    code, reasons = check_witness(tmp_path, witness, "--contract", str(APRENDER_CONTRACT))
    assert not any("reference" in r or r.startswith("logprobs") for r in reasons)


def test_a_stable_reference_and_attributable_band_differences_read_as_before(tmp_path) -> None:
    witness = control()
    witness["reference_logprobs"] = {"logprobs_stable": True, "logprob_reason": None}
    witness["bands"][C8] |= {"logprobs_bitwise_equal": False, "logprob_max_abs_diff": 1e-5,
                             "logprobs_attributable": True}
    assert check_witness(tmp_path, witness) == (
        5, ["logprobs: c=8 logprobs differ from m=1 by up to 1e-05; the contract requires logprobs bitwise equal "
            "to m=1's"])


def test_a_fail_open_is_not_admissible_even_with_no_band(tmp_path) -> None:
    witness = control() | {"bands": [], "fail_open": [FAIL_OPEN, FAIL_OPEN | {"streamed": False, "requests": 1}]}
    code, reasons = check_witness(tmp_path, witness)
    assert code == 5
    never = "; a request that asks for logprobs must never get a 200 without them"
    assert reasons[:2] == [
        f"fail-open: /v1/chat/completions (streamed) answered 2 request(s) with HTTP 200 without logprobs{never}",
        f"fail-open: /v1/chat/completions (not streamed) answered 1 request(s) with HTTP 200 without logprobs{never}",
    ]
    assert reasons[2:] == [f"band c={c} not measured" for c in (1, 4, 8, 16)]
    # Without a fail-open, no band is still unjudgeable.
    assert check_witness(tmp_path, control() | {"bands": [], "fail_open": []})[0] == 4


def section(result: str, *findings: tuple[str, str, bool], reason: str | None = None) -> dict:
    return {"result": result, "reason": reason,
            "findings": [{"kind": k, "text": t, "attributable": a} for k, t, a in findings]}


@pytest.mark.parametrize(("mode", "name"), [("cache", "cache"), ("stream_parity", "stream parity")])
def test_a_modes_attributable_findings_are_its_reasons(tmp_path, mode: str, name: str) -> None:
    warm = f"{name}: c=4 slot 2: logprobs differ by up to 1e-06, first at token 0"
    token = f"{name}: c=8 slot 0: tokens part at token 3"
    blamed_elsewhere = (f"{name}: c=16 slot 1: logprobs differ (not attributable: the plain c=16 band already "
                        "differs from m=1)")
    witness = control() | {mode: section("FAIL", ("logprob", warm, True), ("token", token, True),
                                         ("logprob", blamed_elsewhere, False))}
    assert check_witness(tmp_path, witness) == (5, [warm, token])
    # Logprob-only findings need the bitwise clause; a token finding never does.
    assert check_witness(tmp_path, witness, "--contract", contract_file(tmp_path, require_bitwise_logprobs=False)) == (
        5, [token])


def test_a_mode_that_could_not_compare_is_not_admissible(tmp_path) -> None:
    witness = control() | {"cache": section("UNMEASURABLE", ("refused", "cache: case system, cold: HTTP 500", True),
                                            reason="cache: case system, cold: HTTP 500")}
    assert check_witness(tmp_path, witness) == (
        5, ["cache: result UNMEASURABLE (cache: case system, cold: HTTP 500); the mode did not compare"])
    assert check_witness(tmp_path, control() | {"cache": section("PASS")}) == (0, [])


@pytest.mark.parametrize(("key", "value", "says"), [
    ("fail_open", "yes", 'fail_open must be a list or null, got "yes"'),
    ("fail_open", [{"route": 1}], "fail_open[0].route must be a string or null, got 1"),
    ("cache", {"result": "PASS", "findings": [{"kind": "token", "attributable": "yes"}]},
     'cache.findings[0].attributable must be true or false or null, got "yes"'),
    ("stream_parity", [], "stream_parity must be an object or null, got a list"),
    ("reference_logprobs", {"logprobs_stable": "no"},
     'reference_logprobs.logprobs_stable must be true or false or null, got "no"'),
])
def test_a_wrong_typed_addition_is_refused_by_name(tmp_path, key: str, value: object, says: str) -> None:
    import json

    code, _, err = check_text(tmp_path, json.dumps(control() | {key: value}))
    assert code == 4 and says in err
