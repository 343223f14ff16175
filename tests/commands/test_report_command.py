"""`batchproof report`: one self-contained page from a witness; bad input is one line, never a traceback."""

import json
import re

import pytest

from tests.helpers.check_support import run_cli
from tests.report.witness_sample import sample_witness


def test_the_page_is_written_beside_the_witness_and_needs_nothing_else(tmp_path) -> None:
    witness = tmp_path / "w.json"
    witness.write_text(json.dumps(sample_witness()))
    code, out, _ = run_cli(["report", str(witness)])
    page = (tmp_path / "w.html").read_text()
    assert code == 0 and out == f"report: {tmp_path / 'w.html'} (NOT ADMISSIBLE, 7 reason(s))\n"
    # Self-contained: no script, no stylesheet or image fetched from anywhere.
    assert "<script" not in page and not re.search(r'(src|href)="', page) and "@import" not in page
    assert 'data-band="4" data-slot="1" data-divergence="5"' in page


@pytest.mark.parametrize(
    ("content", "code", "says"),
    [
        (None, 3, "witness {w}: not a regular file"),
        ("{", 4, "witness {w}: not JSON"),
        ("{}", 4, "the witness measured no bands"),
    ],
)
def test_bad_input_is_one_line(tmp_path, content: str | None, code: int, says: str) -> None:
    witness = tmp_path / "w.json"
    if content is not None:
        witness.write_text(content)
    got, out, err = run_cli(["report", str(witness), "-o", str(tmp_path / "r.html")])
    assert (got, out) == (code, "") and err.count("\n") == 1 and says.format(w=witness) in err


def test_an_output_in_no_directory_is_refused(tmp_path) -> None:
    witness = tmp_path / "w.json"
    witness.write_text(json.dumps(sample_witness()))
    code, _, err = run_cli(["report", str(witness), "-o", str(tmp_path / "no" / "r.html")])
    assert code == 3 and err.startswith("batchproof report: -o ")
