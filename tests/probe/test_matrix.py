"""The probe's matrix: the shipped policy, read strictly, and every refusal naming its key."""

from importlib import resources

import pytest
import yaml

from batchproof.probe.matrix import Matrix, MatrixError, load_matrix, parse_matrix

SPEC = {
    "protocol": {"n_predict": 128, "sampler": {"temperature": 0.0, "seed": 0, "ignore_eos": True}},
    "ladder": {"declared": [1, 4, 8, 16]},
    "witness": {"min_agree_tokens": 64, "max_constant_run": 16},
}


def dump(doc: object) -> str:
    return yaml.safe_dump(doc)


def edited(path: list[str], value: object = None, *, delete: bool = False) -> str:
    doc = yaml.safe_load(dump(SPEC))
    node = doc
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return dump(doc)


def test_the_shipped_matrix_is_the_spec() -> None:
    text = resources.files("batchproof.probe").joinpath("perf-matrix.yaml").read_text(encoding="utf-8")
    assert yaml.safe_load(text) == SPEC
    matrix = load_matrix()
    assert matrix == Matrix(128, 0.0, 0, True, (1, 4, 8, 16), 64, 16)


LEAVES = [
    ["protocol"],
    ["protocol", "n_predict"],
    ["protocol", "sampler"],
    ["protocol", "sampler", "temperature"],
    ["protocol", "sampler", "seed"],
    ["protocol", "sampler", "ignore_eos"],
    ["ladder"],
    ["ladder", "declared"],
    ["witness"],
    ["witness", "min_agree_tokens"],
    ["witness", "max_constant_run"],
]


@pytest.mark.parametrize("path", LEAVES, ids=".".join)
def test_a_missing_key_is_refused_by_name(path: list[str]) -> None:
    with pytest.raises(MatrixError, match=f"missing key {'.'.join(path)}$"):
        parse_matrix(edited(path, delete=True))


@pytest.mark.parametrize(
    ("path", "value", "key"),
    [
        (["ladder", "declared"], [], "ladder.declared"),
        (["ladder", "declared"], [1, 0, 4], "ladder.declared"),
        (["ladder", "declared"], [1, -4], "ladder.declared"),
        (["ladder", "declared"], [1, "4"], "ladder.declared"),
        (["ladder", "declared"], 4, "ladder.declared"),
        (["witness", "max_constant_run"], 0, "witness.max_constant_run"),
        (["witness", "min_agree_tokens"], 129, "witness.min_agree_tokens"),
        (["witness", "min_agree_tokens"], 0, "witness.min_agree_tokens"),
        (["protocol", "n_predict"], True, "protocol.n_predict"),
        (["protocol", "n_predict"], 12.5, "protocol.n_predict"),
        (["protocol", "sampler", "ignore_eos"], "yes", "protocol.sampler.ignore_eos"),
        (["protocol", "sampler", "temperature"], "0", "protocol.sampler.temperature"),
        (["protocol", "sampler", "seed"], None, "protocol.sampler.seed"),
        (["witness", "max_constant_runs"], 16, "witness.max_constant_runs"),
    ],
)
def test_a_bad_value_is_refused_by_name(path: list[str], value: object, key: str) -> None:
    with pytest.raises(MatrixError, match=key.replace(".", r"\.")):
        parse_matrix(edited(path, value))


def test_min_agree_tokens_equal_to_n_predict_is_fine() -> None:
    assert parse_matrix(edited(["witness", "min_agree_tokens"], 128)).min_agree_tokens == 128


@pytest.mark.parametrize("text", ["", "[]", "3", "protocol: [", "protocol: 4\nladder: {declared: [1]}"])
def test_a_matrix_that_is_not_the_shape_is_refused(text: str) -> None:
    with pytest.raises(MatrixError):
        parse_matrix(text)


def test_the_ladder_flag_replaces_only_the_ladder_and_is_checked_as_such() -> None:
    matrix = load_matrix().with_ladder([2, 3])
    assert matrix.ladder == (2, 3) and matrix.min_agree_tokens == 64 and matrix.n_predict == 128
    with pytest.raises(MatrixError, match="--ladder"):
        load_matrix().with_ladder([1, 0])
    with pytest.raises(MatrixError, match="--ladder"):
        load_matrix().with_ladder([])


def test_a_matrix_path_that_is_not_a_file_is_refused(tmp_path) -> None:
    with pytest.raises(MatrixError, match="not a file"):
        load_matrix(tmp_path)
    with pytest.raises(MatrixError, match="not a file"):
        load_matrix(tmp_path / "missing.yaml")
    good = tmp_path / "m.yaml"
    good.write_text(dump(SPEC))
    assert load_matrix(good).source == str(good)
