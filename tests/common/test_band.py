"""The Band the probe writes and the check reads: every recorded witness's bands read and written
back are the JSON they were, key for key and in order, and the check's reading of each agrees."""

import json
from pathlib import Path

import pytest

from batchproof.check.witness import BAND_KEYS, typed_witness
from batchproof.common.band import Band, band_json, read_band

ROOT = Path(__file__).resolve().parent.parent.parent
# Ours over the issues (old and new keys), aprender's v2 and v3, the control, and the probe's own
# witnesses against the scripted server (tests/probe/test_witness_unchanged.py).
RECORDED = sorted(
    path
    for pattern in ("tests/check/fixtures/*.json", "bench/results/**/*.json")
    for path in ROOT.glob(pattern)
    if "witness_version" in json.loads(path.read_text(encoding="utf-8"))
)
SCRIPTED = json.loads((ROOT / "tests/probe/fixtures/witness-before.json").read_text(encoding="utf-8"))
WITNESSES = [(path.relative_to(ROOT).as_posix(), json.loads(path.read_text(encoding="utf-8"))) for path in RECORDED]
WITNESSES += [(f"scripted {name}", case["witness"]) for name, case in SCRIPTED.items()]
JUDGED = [(name, witness) for name, witness in WITNESSES if witness["bands"]]  # the check refuses one without


def test_the_recorded_witnesses_are_found() -> None:
    names = [name for name, _ in WITNESSES]
    assert {f"tests/check/fixtures/{name}.json" for name in ("aprender-v2", "aprender-v3", "control")} <= set(names)
    assert any(name.startswith("bench/results/") and w.get("fleet") for name, w in WITNESSES)
    assert len(RECORDED) >= 20 and sum(len(w["bands"]) for _, w in WITNESSES) >= 80


@pytest.mark.parametrize(("name", "witness"), WITNESSES, ids=[name for name, _ in WITNESSES])
def test_a_band_read_and_written_back_is_the_json_it_was(name: str, witness: dict) -> None:
    for band in witness["bands"]:
        written = band_json(read_band(band))
        assert json.dumps(written, indent=2) == json.dumps(band, indent=2)


@pytest.mark.parametrize(("name", "witness"), JUDGED, ids=[name for name, _ in JUDGED])
def test_the_check_reads_the_same_band(name: str, witness: dict) -> None:
    for raw, band in zip(witness["bands"], typed_witness(witness)["bands"], strict=True):
        assert isinstance(band, Band) and band.key_order == tuple(raw)
        judged = ["c", *BAND_KEYS]
        assert {key: getattr(band, key) for key in judged} == {key: raw.get(key) for key in judged}
        assert band.m_formed_by_replica == raw.get("m_formed_by_replica")
        assert [slot["i"] for slot in band.slots] == list(range(len(raw.get("slots") or [])))


def test_a_band_the_probe_makes_is_written_in_the_witness_order_with_the_margin_only_when_set() -> None:
    band = Band(c=4, m_formed=4, result="PASS", divergence_at=12)
    keys = list(band_json(band))
    assert keys[:6] == ["c", "m_formed", "m_formed_source", "result", "divergence_at", "intra_agree_to"]
    assert keys[-3:] == ["m_formed_by_replica", "probe_cpu_share", "slots"]
    assert "key_order" not in keys and "other_keys" not in keys
    parted = band_json(Band(c=4, divergence_at=3, top2_margin_at_divergence=0.01))
    assert list(parted)[4:6] == ["divergence_at", "top2_margin_at_divergence"]


def test_keys_of_other_probes_are_kept_where_they_were() -> None:
    raw = {"c": 2, "env": {"gpu": "x"}, "result": "PASS", "key_order": "a key of theirs", "slots": None}
    band = read_band(raw)
    assert band.other_keys == {"env": {"gpu": "x"}, "key_order": "a key of theirs"} and band.slots is None
    assert list(band_json(band).items()) == list(raw.items())
