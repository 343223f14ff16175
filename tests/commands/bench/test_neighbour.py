"""`batchproof bench --neighbour`: the figures a committed run wrote rebuild from its file, the
table reads them as busy / quiet, and the command refuses to run with nothing to measure."""

import json
from pathlib import Path

from batchproof.cli import main
from batchproof.commands.bench import neighbour
from batchproof.commands.bench.figures import as_json

RESULTS = Path(__file__).resolve().parents[3] / "bench" / "results"


def test_a_committed_run_rebuilds_and_reads_as_busy_over_quiet(capsys) -> None:
    row = json.loads((RESULTS / "neighbour-zen3-stale-fix.json").read_text())
    figures = neighbour.NeighbourFigures(**row)
    assert json.dumps(as_json(figures)) == json.dumps(row)
    neighbour.report(figures)
    out = capsys.readouterr().out
    quiet, busy = figures.median("ours (adaptive)", "quiet", 16), figures.median("ours (adaptive)", "busy", 16)
    assert f"{busy / quiet:.2f}" in out and "family 25" in out


def test_nothing_to_measure_is_refused(capsys) -> None:
    assert main(["bench", "--neighbour"]) == 2
    assert "--neighbour measures --serve, --url or --vs" in capsys.readouterr().err
