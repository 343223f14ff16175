"""The report's sections of issue 27 on witnesses the probe wrote against scripted servers: the
reference's stability in plain words, cold against warm, streamed against whole, and fail-open."""

import json
from pathlib import Path

import pytest

from tests.helpers.check_support import run_cli
from tests.helpers.quirky_server import Quirks, QuirkyServer
from tests.helpers.scripted_server import run_probe


def report(tmp_path: Path, witness: dict) -> tuple[int, str, str]:
    path = tmp_path / "drawn.json"
    path.write_text(json.dumps(witness))
    code, _, err = run_cli(["report", str(path), "-o", str(tmp_path / "drawn.html")])
    page = (tmp_path / "drawn.html").read_text() if code == 0 else ""
    return code, page, err


@pytest.fixture(scope="module")
def warm_witness(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Warm replies 1e-6 below cold ones, measured with --cache and --stream-parity."""
    tmp_path = tmp_path_factory.mktemp("warm")
    with QuirkyServer(quirks=Quirks(warm_shift=1e-6)) as server:
        _, witness = run_probe(server.url, tmp_path, "--cache", "--stream-parity")
    return witness


def test_the_reference_is_said_plainly_and_its_instability_named(tmp_path: Path, warm_witness: dict) -> None:
    code, page, _ = report(tmp_path, warm_witness)
    assert code == 0
    assert "self-agreement" not in page
    assert "tokens stable: the two alone runs agree on 12 of 12; logprobs NOT STABLE: reference: logprobs of two " \
           "alone runs differ by 1e-06 at token 0" in page
    assert '<h2 id="reference-stability">' in page and "differ by 1e-06 from token 0" in page


def test_cold_against_warm_is_drawn_per_case_and_slot(tmp_path: Path, warm_witness: dict) -> None:
    _, page, _ = report(tmp_path, warm_witness)
    assert '<h2 id="cache">' in page and '<table class="grid" id="cache-system">' in page
    assert "case turn: the warmer shares the first turn (a multi-turn continuation)" in page
    assert "cache: case system, warm alone #1 (" in page and "warm c=4 slot 3" in page
    assert "no: the plain c=4 band already differs from m=1" in page


def test_stream_parity_is_drawn_pair_by_pair(tmp_path: Path, warm_witness: dict) -> None:
    _, page, _ = report(tmp_path, warm_witness)
    assert '<h2 id="stream-parity">' in page and '<table class="grid" id="stream-pairs">' in page
    assert "compared: every m=1 reference&#x27;s first run and every band slot" in page


def test_a_fail_open_witness_is_drawn_without_bands(tmp_path: Path) -> None:
    with QuirkyServer(quirks=Quirks(refuse=("ignore_eos",), has_logprobs=False)) as server:
        _, witness = run_probe(server.url, tmp_path, "--stream-parity")
    code, page, _ = report(tmp_path, witness)
    assert code == 0 and 'class="verdict no">NOT ADMISSIBLE' in page
    assert "fields the server refused, left out of every request: ignore_eos" in page
    assert "FAIL-OPEN: /v1/chat/completions (not streamed) answered 1 request(s)" in page


@pytest.mark.parametrize(("change", "says"), [
    (lambda w: w.update(dropped_fields="seed"), 'dropped_fields must be a list or null, got "seed"'),
    (lambda w: w["cache"]["cases"][0]["slots"][0].update(cached_tokens="9"),
     'cache.cases[0].slots[0].cached_tokens must be an integer or null, got "9"'),
    (lambda w: w["stream_parity"].update(pairs=[3]), "stream_parity.pairs must be a list of objects or null"),
    (lambda w: w["references"][0].update(logprob_first_diff_at=0.5),
     "references[0].logprob_first_diff_at must be an integer or null, got 0.5"),
])
def test_a_wrong_typed_addition_is_refused_by_name(tmp_path: Path, warm_witness: dict, change, says: str) -> None:
    witness = json.loads(json.dumps(warm_witness))
    change(witness)
    code, _, err = report(tmp_path, witness)
    assert code == 4 and says in err
