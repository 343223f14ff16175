"""The probe's own share of the machine during each band (issue 60): written in every band of the
witness so a reader of any server's witness can see how much of a small machine the client took."""

from pathlib import Path

import pytest

from batchproof.probe import run
from tests.helpers.scripted_server import Script, ScriptedServer, run_probe


def test_every_band_carries_the_probes_cpu_share_between_0_and_1(tmp_path: Path) -> None:
    with ScriptedServer(Script(has_histogram=True)) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 0 and witness["bands"]
    for band in witness["bands"]:
        share = band["probe_cpu_share"]
        assert isinstance(share, float) and 0.0 < share <= 1.0, band["c"]


def test_the_share_is_cpu_time_over_wall_time_and_the_cores_this_process_may_use(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert run.cpu_share(1.0, 2.0) == 0.25  # one CPU second in two wall seconds on two cores
    assert run.cpu_share(5.0, 2.0) == 1.0  # never above the whole machine (a clock's jitter)
    assert run.cpu_share(1.0, 0.0) is None  # no span, no share
