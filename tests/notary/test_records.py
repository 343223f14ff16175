"""notary/records.py: a record read whole, and each way one can be wrong named by its field."""

import pytest

from batchproof.notary.records import RecordError, parse_line, parse_record

GOOD = {"prompt_token_ids": [1, 2], "completion_token_ids": [3, 4], "logprobs": [-0.5, -1.25]}


def test_a_good_record_with_alternatives():
    rollout = parse_record({**GOOD, "id": "a", "top_logprobs": [{"3": -0.5, "9": -2.0}, None]}, "line 1", 10)
    assert rollout.completion_token_ids == [3, 4] and rollout.logprobs == [-0.5, -1.25]
    assert rollout.top_logprobs == [{3: -0.5, 9: -2.0}, None] and rollout.rollout_id == "a"


@pytest.mark.parametrize(("text", "field", "says"), [
    ("[1, 2", "line", "not JSON"),
    ('{"prompt_token_ids": [1], "completion_token_ids": [2], "logprobs": [NaN]}', "line", "NaN"),
    ("[]", "record", "JSON object"),
    ('{"prompt_token_ids": [1], "completion_token_ids": [10], "logprobs": [-1]}', "completion_token_ids", "10"),
    ('{"prompt_token_ids": [1, true], "completion_token_ids": [2], "logprobs": [-1]}', "prompt_token_ids", "True"),
    ('{"prompt_token_ids": [1], "completion_token_ids": [2, 3], "logprobs": [-1]}', "logprobs", "1 values for 2"),
    ('{"prompt_token_ids": [1], "completion_token_ids": [2], "logprobs": ["x"]}', "logprobs", "'x'"),
    ('{"prompt_token_ids": [1], "completion_token_ids": [2], "logprobs": [-1], "top_logprobs": []}',
     "top_logprobs", "1 objects"),
    ('{"prompt_token_ids": [1], "completion_token_ids": [2], "logprobs": [-1], "id": 5}', "id", "string"),
    ('{"prompt_token_ids": [1], "completion_token_ids": [2]}', "logprobs", "None"),
])
def test_bad_lines_name_the_line_and_field(text, field, says):
    with pytest.raises(RecordError) as caught:
        parse_line(text, "line 7", 10)
    assert caught.value.field == field and caught.value.where == "line 7"
    assert str(caught.value).startswith("line 7: ") and says in str(caught.value)
