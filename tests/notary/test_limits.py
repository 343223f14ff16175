"""notary/limits.py: the entries a request is counted at bound its report's bytes in the worst
case (every position a near tie and a disagreement, every float at 17 digits, ids of escaped
characters), and each list past its limit is named by the field the API spells."""

import random

import pytest

from batchproof.common.wire import dumps
from batchproof.notary.limits import (
    BYTES_PER_ENTRY,
    ENTRIES_PER_ROLLOUT,
    ENTRIES_PER_TOKEN,
    MAX_ID_CHARS,
    MAX_TIS_CAPS,
    Bounds,
    TooLarge,
    check_sizes,
)
from batchproof.notary.metrics import Scored, report
from batchproof.notary.records import Rollout
from batchproof.notary.settings import Settings

BOUNDS = Bounds(max_rollouts=8, max_tokens=100, max_alternatives=3, max_entries=1000)
RECORD = {"prompt_token_ids": [1, 2], "completion_token_ids": [3, 4], "logprobs": [-1.0, -2.0]}


def _worst(num_rollouts: int, num_tokens: int) -> str:
    rng = random.Random(0)
    rollouts, scores = [], []
    for k in range(num_rollouts):
        ids = [40000 + i for i in range(num_tokens)]
        claimed = [-rng.uniform(1e-9, 0.6) for _ in ids]  # above -log 2: their top-1 is the token itself
        ours = [-rng.uniform(1.0, 9.9) * 1e-5 - 2 for _ in ids]
        top = [((10000 + i, o + 1e-7), (t, o)) for i, (t, o) in enumerate(zip(ids, ours))]  # our top-1 another
        rollouts.append(Rollout(f"rollouts[{k}]", [1], ids, claimed, None, "\x00" * MAX_ID_CHARS))
        scores.append(Scored(ours, top))
    caps = tuple(float(c) + 0.123456789 for c in range(MAX_TIS_CAPS))
    return dumps(report(rollouts, scores, Settings(tis_caps=caps), [], {"model_sha256": "a" * 64}))


@pytest.mark.parametrize(("num_rollouts", "num_tokens"), [(1, 3000), (40, 60), (200, 1)])
def test_the_counted_entries_bound_the_reports_bytes(num_rollouts, num_tokens):
    fixed = len(_worst(0, 0))  # the tables every report has
    body = _worst(num_rollouts, num_tokens)
    entries = num_rollouts * (ENTRIES_PER_ROLLOUT + ENTRIES_PER_TOKEN * num_tokens)
    assert '"explained_by_near_tie":true' in body and "near_ties" in body
    assert len(body.encode()) - fixed <= entries * BYTES_PER_ENTRY


@pytest.mark.parametrize(("body", "field", "says"), [
    ({"tis_caps": [1] * (MAX_TIS_CAPS + 1)}, "tis_caps", f"at most {MAX_TIS_CAPS}"),
    ({"mask_band": [0.5, 1, 2]}, "mask_band", "two"),
    ({"rollouts": [RECORD] * 9}, "rollouts", "--max-queue"),
    ({"rollouts": [RECORD, {**RECORD, "prompt_token_ids": [1] * 99}]}, "rollouts[1].completion_token_ids", "101"),
    ({"rollouts": [{**RECORD, "logprobs": [-1.0] * 101}]}, "rollouts[0].logprobs", "101 values"),
    ({"rollouts": [{**RECORD, "top_logprobs": [{"1": -1, "2": -2, "3": -3, "4": -4}, None]}]},
     "rollouts[0].top_logprobs", "top_logprobs[0]"),
    ({"rollouts": [{**RECORD, "id": "x" * (MAX_ID_CHARS + 1)}]}, "rollouts[0].id", "characters"),
    ({"rollouts": [{**RECORD, **{f"k{i}": 0 for i in range(6)}}]}, "rollouts[0]", "fields"),
    ({"rollouts": [{**RECORD, "completion_token_ids": [3] * 90}] * 2}, "rollouts", "--max-logprob-entries"),
])
def test_each_list_past_its_limit_is_named(body, field, says):
    with pytest.raises(TooLarge) as caught:
        check_sizes(body, BOUNDS)
    assert caught.value.field == field and says in str(caught.value)


def test_lists_within_their_limits_and_other_types_pass_to_the_record_checks():
    check_sizes({"rollouts": [RECORD] * 8, "tis_caps": [2] * MAX_TIS_CAPS, "mask_band": [0.5, 2]}, BOUNDS)
    check_sizes({"rollouts": [5, {"logprobs": "x"}], "tis_caps": 3}, BOUNDS)
