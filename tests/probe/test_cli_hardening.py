"""The probe's command line against hostile input: a matrix with YAML aliases (a "billion laughs"),
nested past any matrix or larger than one, is refused in one line before any request (exit 4);
the API key comes from $BATCHPROOF_API_KEY too, so it need not be on the command line."""

import argparse
import json
from pathlib import Path

import pytest

from batchproof.commands import probe
from batchproof.probe.matrix import MAX_MATRIX_BYTES, MatrixError, parse_matrix
from tests.helpers.check_support import run_cli
from tests.helpers.scripted_server import SMALL_MATRIX, Script, ScriptedServer, closed_port_url, run_probe

EXIT_BAD_MATRIX = 4


def laughs(levels: int) -> str:
    """A valid-looking matrix whose n_predict is 9**levels ones built from nested aliases."""
    items = ["&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    items += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return SMALL_MATRIX.replace("n_predict: 12", f"n_predict: [{', '.join(items)}]")


def _probe_with_matrix(tmp_path: Path, text: str) -> tuple[int, str, str]:
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(text)
    # Nothing listens at the URL: a matrix refused is refused before any request.
    return run_cli(["probe", "--url", closed_port_url(), "--matrix", str(matrix)])


@pytest.mark.parametrize(("text", "says"), [
    # 9**7 ones: expanded, its message alone was 17 MB (9**9: gigabytes)
    (laughs(7), "anchors and aliases (& and *) are not allowed"),
    ("x: &one 1\n" + SMALL_MATRIX, "anchors and aliases (& and *) are not allowed"),  # an anchor alone too
    ("[" * 20_000, "nested deeper than 16"),  # a RecursionError traceback before
])
def test_a_hostile_matrix_is_refused_in_one_line(tmp_path: Path, text: str, says: str) -> None:
    code, out, err = _probe_with_matrix(tmp_path, text)
    assert (code, out) == (EXIT_BAD_MATRIX, "")
    assert err.startswith("batchproof probe: matrix ") and says in err
    assert err.count("\n") == 1 and len(err) < 600


def test_a_matrix_larger_than_any_matrix_is_not_read(tmp_path: Path) -> None:
    padded = SMALL_MATRIX + "#" * MAX_MATRIX_BYTES + "\n"  # valid YAML: only its size is wrong
    code, out, err = _probe_with_matrix(tmp_path, padded)
    assert (code, out) == (EXIT_BAD_MATRIX, "") and "larger than 64 KiB" in err


def test_a_long_wrong_value_is_quoted_cut_short() -> None:
    with pytest.raises(MatrixError) as raised:
        parse_matrix(SMALL_MATRIX.replace("n_predict: 12", f"n_predict: [{', '.join(['7'] * 50_000)}]"))
    assert "protocol.n_predict must be an integer >= 1" in str(raised.value) and len(str(raised.value)) < 300


def test_the_api_key_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHPROOF_API_KEY", "sk-from-env")
    with ScriptedServer(Script(has_histogram=True)) as server:
        code, witness = run_probe(server.url, tmp_path, "--prompt", "Say hi.")
    assert code == 0
    assert server.state.authorizations and set(server.state.authorizations) == {"Bearer sk-from-env"}
    assert "sk-from-env" not in json.dumps(witness)


def test_the_flag_wins_over_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHPROOF_API_KEY", "sk-from-env")
    with ScriptedServer(Script(has_histogram=True)) as server:
        run_probe(server.url, tmp_path, "--prompt", "Say hi.", "--api-key", "sk-flag")
    assert set(server.state.authorizations) == {"Bearer sk-flag"}


def test_the_help_names_the_variable() -> None:
    parser = argparse.ArgumentParser()
    probe.add_arguments(parser)
    assert "$BATCHPROOF_API_KEY" in parser.format_help()
