"""Any number JSON can carry is scored or refused by name, never an exception: vLLM's -9999
clamps of -inf are scored (the sums cannot overflow), a number no float holds (1e400 reads as
inf, 10**400 as an int float() refuses) and a key that only looks like digits ("²") are bad
records naming their field, and settings past the float range are refused by name."""

import json
import math
import sys

import pytest

from batchproof.common.wire import dumps
from batchproof.notary.metrics import Scored, report
from batchproof.notary.records import RecordError, Rollout, parse_line, parse_record
from batchproof.notary.settings import SettingError, Settings

GOOD = {"prompt_token_ids": [1, 2], "completion_token_ids": [3, 4, 5], "logprobs": [-0.5, -1.25, -2.0]}


def _scored(num: int) -> Scored:
    return Scored([-0.25] * num, [((3, -0.25), (7, -3.0))] * num)


@pytest.mark.parametrize("claim", [-9999.0, -1e300, -sys.float_info.max])
def test_clamped_and_huge_claims_are_scored_to_finite_json(claim):
    rollouts = [Rollout(f"line {i}", [1], [3, 3, 3], [claim] * 3) for i in range(3)]
    rep = report(rollouts, [_scored(3)] * 3, Settings(), [], {})
    decoded = json.loads(dumps(rep))  # dumps refuses NaN and infinity
    assert decoded["summary"]["num_tokens"] == 9 and decoded["summary"]["mean_abs_diff"] > 9000
    ratios = decoded["frameworks"]["trl"]
    assert ratios["sampling/importance_sampling_ratio/max"] == math.exp(709)  # the ratio's cap
    assert ratios["sampling/importance_sampling_ratio/mean"] == pytest.approx(math.exp(709))
    assert decoded["frameworks"]["nemo-rl"]["train/gen_kl_error"] > 1e307
    assert decoded["frameworks"]["verl"]["training/rollout_probs_diff_max"] == pytest.approx(math.exp(-0.25))
    first = decoded["rollouts"][0]
    assert math.isfinite(first["log_ratio_sum"]) and first["log_ratio_sum"] > 0


def test_a_mean_that_does_not_overflow_keeps_its_bits():
    rollouts = [Rollout("line 1", [1], [3, 3], [-0.1, -0.7])]
    rep = report(rollouts, [Scored([-0.3, -0.2], [((3, -0.2), (7, -3.0))] * 2)], Settings(), [], {})
    assert rep["summary"]["mean_abs_diff"] == math.fsum([abs(-0.1 + 0.3), abs(-0.7 + 0.2)]) / 2


@pytest.mark.parametrize(("line", "field", "says"), [
    ('{"prompt_token_ids": [1], "completion_token_ids": [2], "logprobs": [-1' + "0" * 400 + "]}",
     "logprobs", "logprobs[0]"),
    ('{"prompt_token_ids": [1], "completion_token_ids": [2], "logprobs": [-1e400]}', "logprobs", "inf"),
    ('{"prompt_token_ids": [1], "completion_token_ids": [2], "logprobs": [-1], "top_logprobs": [{"\\u00b2": -1}]}',
     "top_logprobs", "'²'"),
    ('{"prompt_token_ids": [1], "completion_token_ids": [2], "logprobs": [-1], "top_logprobs": [{"\\u0661": -1}]}',
     "top_logprobs", "not a token id"),
    ('{"prompt_token_ids": [1], "completion_token_ids": [2], "logprobs": [-1], "top_logprobs": [{"2": -1e400}]}',
     "top_logprobs", "top_logprobs[0][2]"),
])
def test_numbers_no_float_holds_are_bad_records_naming_the_field(line, field, says):
    with pytest.raises(RecordError) as caught:
        parse_line(line, "line 3", 10)
    assert caught.value.field == field and says in str(caught.value) and str(caught.value).startswith("line 3: ")


def test_a_huge_integer_logprob_in_a_decoded_record():
    with pytest.raises(RecordError, match=r"logprobs\[1\]") as caught:
        parse_record({**GOOD, "logprobs": [-0.5, -10**400, -1.0]}, "rollouts[0]", 10)
    assert caught.value.field == "logprobs"
    assert parse_record({**GOOD, "logprobs": [-9999, -9999, -9999]}, "rollouts[0]", 10).logprobs == [-9999.0] * 3


@pytest.mark.parametrize(("fields", "field"), [
    ({"near_tie": math.inf}, "near_tie"), ({"near_tie": math.nan}, "near_tie"), ({"near_tie": -1.0}, "near_tie"),
    ({"tis_caps": (2.0, math.inf)}, "tis_caps"), ({"mask_band": (0.5, math.inf)}, "mask_band"),
    ({"mask_band": (0.5, 0.9)}, "mask_band"),
])
def test_settings_out_of_range_name_their_field(fields, field):
    with pytest.raises(SettingError) as caught:
        Settings(**fields)
    assert caught.value.field == field
