"""/v1/server_info's `fleet.numerics_agree`: whether every live replica would answer a greedy
request with the same bits, read from each replica's numerics_id (model, weights, dtype,
arithmetic and source), not from any one part of it such as the kernels' version."""

from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("ray")

from batchproof.fleet.router import FleetFront  # noqa: E402  (after the skip: it imports ray)

KERNELS = "batchproof kernels 7"  # the same kernels' numerics version on every replica


class Reports:
    """The registry's reports, as ReplicaReports.latest() hands them to the ingress."""

    def __init__(self, reports: list[dict]) -> None:
        self._reports = reports

    def latest(self) -> list[dict]:
        return self._reports


def report(replica_id: str, numerics_id: str, alive: bool = True) -> dict:
    return {"id": replica_id, "host": "127.0.0.1", "pid": 1, "node_id": "n", "decode_path": "kernels",
            "build_sha256": "b", "numerics_id": numerics_id, "alive": alive, "num_running": 0, "num_waiting": 0,
            "engine": {"numerics": KERNELS, "model_sha256": numerics_id}}


def numerics_agree(*reports: dict) -> bool:
    front = SimpleNamespace(tokenizer=None, chat_template=None, chat_template_origin=None, max_model_len=0,
                            model_path=Path("."))
    return FleetFront(front, Reports(list(reports))).info()["fleet"]["numerics_agree"]


def test_live_replicas_with_different_numerics_ids_disagree_though_their_kernels_are_the_same():
    assert numerics_agree(report("a", "1111"), report("b", "2222")) is False


def test_live_replicas_with_the_same_numerics_id_agree_and_a_dead_one_is_not_counted():
    assert numerics_agree(report("a", "1111"), report("b", "1111")) is True
    assert numerics_agree(report("a", "1111"), report("b", "1111"), report("c", "2222", alive=False)) is True
    assert numerics_agree(report("a", "1111"), report("b", "1111"), report("c", "2222")) is False
