"""The v3 additions the check reads: per-slot divergence (mixed bands) and the optional
bitwise-logprobs clause (on in our contract, off in aprender's)."""

import pytest
import yaml

from batchproof.check.contract import ContractError, contract_from_text, load_contract, shipped_contract_text
from tests.helpers.check_support import APRENDER_CONTRACT, C4, C8, check_text, check_witness, control, mutated

SLOTS = [{"i": i, "divergence_at": 128, "top2_margin_at_divergence": None, "logprob_max_abs_diff": 0.0,
          "logprobs_bitwise_equal": True, "logprob_first_diff_at": None} for i in range(4)]


def with_slots(index: int, slots: list[dict]):
    def apply(witness: dict) -> None:
        witness["bands"][index]["slots"] = slots

    return apply


def slot(i: int, **changes: object) -> dict:
    return {**SLOTS[i], **changes}


def test_the_clause_is_on_in_ours_and_absent_means_off() -> None:
    assert load_contract().require_bitwise_logprobs is True
    assert load_contract(APRENDER_CONTRACT).require_bitwise_logprobs is False


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_clause_that_is_not_a_boolean_is_refused_by_name(value: object) -> None:
    raw = yaml.safe_load(shipped_contract_text()) | {"require_bitwise_logprobs": value}
    with pytest.raises(ContractError, match="require_bitwise_logprobs: must be true or false"):
        contract_from_text(yaml.safe_dump(raw))


def test_differing_logprobs_are_named_with_the_band_the_size_and_the_slot(tmp_path) -> None:
    def differ(witness: dict) -> None:
        band = witness["bands"][C8]
        band |= {"logprobs_bitwise_equal": False, "logprob_max_abs_diff": 1.0e-5}
        band["slots"] = [slot(0), slot(1, logprobs_bitwise_equal=False, logprob_max_abs_diff=1.0e-5,
                                        logprob_first_diff_at=17)]

    code, reasons = check_witness(tmp_path, mutated(differ))
    assert code == 5 and reasons == [
        "logprobs: c=8 logprobs differ from m=1 by up to 1e-05 (slot 1, first at token 17); "
        "the contract requires logprobs bitwise equal to m=1's"
    ]


def test_unrecorded_logprob_parity_is_not_admissible_under_ours(tmp_path) -> None:
    def unrecorded(witness: dict) -> None:
        del witness["bands"][C4]["logprobs_bitwise_equal"]

    code, reasons = check_witness(tmp_path, mutated(unrecorded))
    assert code == 5 and reasons == [
        "logprobs: c=4 logprob parity with m=1 not recorded; the contract requires logprobs bitwise equal to m=1's"
    ]


def test_each_slot_is_judged_against_its_own_reference(tmp_path) -> None:
    slots = [slot(0), slot(1, divergence_at=70), slot(2, divergence_at=3), slot(3, divergence_at=5,
                                                                                top2_margin_at_divergence=0.01)]
    code, reasons = check_witness(tmp_path, mutated(with_slots(C4, slots)))
    assert code == 5 and reasons == ["S5: c=4 slot 2 diverges from m=1 at 3 < declared_min 64 with no top-2 "
                                     "margin recorded"]


def test_a_slot_near_tie_counts_toward_the_cap(tmp_path) -> None:
    tie = [slot(0, divergence_at=5, top2_margin_at_divergence=0.01)]
    code, reasons = check_witness(tmp_path, mutated(with_slots(C4, tie), with_slots(C8, tie)))
    assert code == 5 and reasons == [
        "near-tie cap: 2 batched bands (c=4, c=8) are admitted only by a near-tie margin; the contract allows 1"
    ]
    assert check_witness(tmp_path, mutated(with_slots(C4, tie)))[0] == 0


@pytest.mark.parametrize(
    ("slots", "says"),
    [
        ({"i": 0}, "bands[1].slots must be a list or null"),
        ([3], "bands[1].slots[0] must be an object"),
        ([{"divergence_at": "3"}], "bands[1].slots[0].divergence_at must be an integer or null"),
        ([{"logprobs_bitwise_equal": "true"}], "bands[1].slots[0].logprobs_bitwise_equal must be true or false"),
    ],
)
def test_a_slot_of_the_wrong_shape_is_red(tmp_path, slots: object, says: str) -> None:
    import json

    code, _, err = check_text(tmp_path, json.dumps(mutated(with_slots(C4, slots))))
    assert code == 4 and says in err


def test_a_band_logprob_flag_of_the_wrong_type_is_red(tmp_path) -> None:
    import json

    witness = control()
    witness["bands"][C4]["logprobs_bitwise_equal"] = 1
    code, _, err = check_text(tmp_path, json.dumps(witness))
    assert code == 4 and "bands[1].logprobs_bitwise_equal must be true or false or null, got 1" in err
