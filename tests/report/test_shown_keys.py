"""`batchproof report` on a witness whose shown keys have the wrong type: exit 4 and one line
naming the key, as `batchproof check` does for the keys it judges; never a traceback."""


import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.report.witness_sample import put, report, sample_witness

JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
JSON_VALUES = st.recursive(
    JSON_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def _paths(value: object, prefix: tuple = ()) -> list[tuple]:
    """Every key path in the sample witness, to put a wrong value at."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return []
    return [path for key, child in items for path in [(*prefix, key), *_paths(child, (*prefix, key))]]


PATHS = _paths(sample_witness())




@pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        (("sampler",), [12], "sampler must be an object or null, got a list"),
        (("sampler", "max_tokens"), "12", 'sampler.max_tokens must be an integer or null, got "12"'),
        (("stagger_ms",), "0", 'stagger_ms must be a number or null, got "0"'),
        (("prompts",), 4, "prompts must be a list or null, got 4"),
        (("reference",), "stable", 'reference must be an object or null, got "stable"'),
        (("bands", 1, "slots", 3, "stream_mode_conflict"), 7,
         "bands[1].slots[3].stream_mode_conflict must be a string or null, got 7"),
        (("bands", 0, "slots", 0, "decode_tok_s"), "fast",
         'bands[0].slots[0].decode_tok_s must be a number or null, got "fast"'),
    ],
)
def test_a_wrong_typed_shown_key_exits_4_naming_it(tmp_path, path: tuple, value: object, says: str) -> None:
    code, out, err = report(tmp_path, put(sample_witness(), path, value))
    assert (code, out) == (4, "")
    assert err == f"batchproof report: witness {tmp_path / 'w.json'}: {says}\n"
    assert not (tmp_path / "r.html").exists()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS), value=JSON_VALUES)
def test_any_value_anywhere_is_drawn_or_refused_in_one_line(tmp_path, path: tuple, value: object) -> None:
    code, out, err = report(tmp_path, put(sample_witness(), path, value))
    if code == 0:
        assert out.startswith("report: ") and err == ""
    else:
        assert (code, out) == (4, "") and err.count("\n") == 1, err


def test_a_key_chosen_by_the_witness_is_quoted_cut_and_stripped_in_the_message(tmp_path) -> None:
    replica = "\x1b[2J\x1b]0;owned\x07" + "r" * 5000  # clear the screen, retitle the terminal, flood it
    witness = put(sample_witness(), ("bands", 1, "m_formed_by_replica"), {replica: "four"})
    code, _, err = report(tmp_path, witness)
    assert code == 4 and "bands[1].m_formed_by_replica." in err and "must be an integer or null" in err
    assert "\x1b" not in err and "\x07" not in err and len(err) < 400
