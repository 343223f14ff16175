"""Each bench's figures, rebuilt from the runs a committed bench/results file holds, write that
file back key for key, and the figures it derives (medians, ratios, the lines of ratios) equal
the ones the run wrote: the dataclasses keep every file and the docs that quote it valid."""

import json
from pathlib import Path

import pytest

from batchproof.commands.bench import fleet, prefix_cache, speed, structured
from batchproof.commands.bench.figures import as_json, median
from batchproof.commands.bench.fleet import FleetFigures, FleetMemory
from batchproof.commands.bench.http import Band
from batchproof.commands.bench.invariance_cost import CostRow, InvarianceCost, table
from batchproof.commands.bench.prefix_cache import LmEvalFigures, PrefixCacheFigures, TtftRuns
from batchproof.commands.bench.structured import StructuredFigures, StructuredRow

RESULTS = Path(__file__).resolve().parents[3] / "bench" / "results"


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def same(figures, row) -> bool:
    """Equal as JSON, key order included."""
    return json.dumps(as_json(figures)) == json.dumps(row)


def server(row: dict) -> speed.ServerFigures:
    return speed.ServerFigures(**{**row, "bands": [Band(**band) for band in row["bands"]]})


@pytest.mark.parametrize("name", [f"bench-quantized-{n}.json" for n in (5, 6, 7)])
def test_speed(name):
    row = load(name)
    results = speed.SpeedResults(machine=row["machine"], engine=speed.EngineFigures(**row["engine"]),
                                 ours=server(row["ours"]), peer=server(row["peer"]), ratios=row["ratios"])
    assert same(results, row)
    assert speed.ratios(results) == row["ratios"]
    assert results.ours.decode_tok_s == median(results.ours.decode_runs[0])


def test_speed_leaves_out_what_it_did_not_measure():
    """--no-engine, --url without --serve (no peak memory), no peer: the keys a run of that kind wrote."""
    ours = speed.ServerFigures(decode_tok_s=1.0, decode_top20_tok_s=1.0, decode_runs=[[1.0], [1.0]], ttft_600_s=0.1,
                               url="http://x", model=None, bands=[Band(c=1, aggregate_tok_s=1.0,
                                                                       per_request_tok_s=1.0, ttft_s=0.1)])
    row = as_json(speed.SpeedResults(machine={}, ours=ours))
    assert list(row) == ["machine", "ours", "ratios"]
    assert list(row["ours"]) == ["decode_tok_s", "decode_top20_tok_s", "decode_runs", "ttft_600_s", "url", "model",
                                 "bands"]
    assert row["ours"]["model"] is None  # measured: the server named no model
    assert list(row["ours"]["bands"][0]) == ["c", "aggregate_tok_s", "per_request_tok_s", "ttft_s"]


def test_invariance_cost():
    row = load("invariance-cost.json")
    *rows, run = row["invariance_cost"]
    cost = InvarianceCost(rows=[CostRow(**r) for r in rows], **run)
    results = speed.SpeedResults(machine=row["machine"], invariance_cost=cost)
    assert same(results, row)
    assert table(cost).splitlines()[2] == "| 1 | 26 tok/s | 13 tok/s | 2.0x |"


def test_prefix_cache(capsys):
    row = load("prefix-cache.json")["prefix_cache"]
    figures = PrefixCacheFigures(ttft_runs=TtftRuns(**row["ttft_runs"]), c16_runs=row["c16_runs"],
                                 lm_eval=LmEvalFigures(**row["lm_eval"]))
    # the medians and ratios, recomputed from the runs, are the file's (a run from before the
    # shared-prompt band: its figures are None, and the file has none)
    assert json.dumps({k: v for k, v in as_json(figures).items() if v is not None or k in row}) == json.dumps(row)
    prefix_cache.report(figures)
    assert "cold 5154 ms, cached 167 ms (3.2% of cold)" in capsys.readouterr().out


def test_fleet(capsys):
    row = load("fleet-vs-serve.json")["fleet"]
    figures = FleetFigures(**{**row, "memory_mb": FleetMemory(**row["memory_mb"])})
    assert same(figures, row)
    fleet.report(figures)
    assert "c=16 aggregate: fleet 2x1 85.3 tok/s, serve 2 threads 128.0 tok/s: 0.67x" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["structured-cost-smollm2.json", "structured-cost-gemma3-270m.json"])
def test_structured(name, capsys):
    row = load(name)["structured"]
    figures = StructuredFigures(**{**row, "rows": [StructuredRow(**r) for r in row["rows"]]})
    assert same(figures, row)
    structured.report(figures)
    measured = sum(2 + (r.get("auto_tools_tok_s") is not None) for r in row["rows"])
    assert capsys.readouterr().out.count(" tok/s | ") == measured


def test_a_run_names_its_cpu_first():
    """Ratios against a peer move with the CPU, so a run's lines open with the machine it ran on."""
    from batchproof.commands.bench import machine

    described = machine.describe()
    assert {"cpus", "host", "cpu", "kernels_isa"} <= set(described) and described["cpu"]
    lines = speed.ratios(speed.SpeedResults(machine=described))
    assert lines == [machine.line(described)] and described["cpu"] in lines[0]
