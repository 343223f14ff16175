"""Every m_formed source and every server's entry shape, end to end through the probe."""

from pathlib import Path

import pytest

from tests.helpers.scripted_server import Script, ScriptedServer, run_probe, split_character


def bands_of(witness: dict) -> list[tuple[int, int, str | None, str]]:
    return [(b["c"], b["m_formed"], b["m_formed_source"], b["result"]) for b in witness["bands"]]


def test_our_histogram_is_read_even_when_it_lags_the_streams(tmp_path: Path) -> None:
    with ScriptedServer(Script(has_histogram=True, record_delay_s=0.15)) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 0
    assert bands_of(witness) == [(1, 1, "metrics", "PASS"), (4, 4, "metrics", "PASS")]


def test_a_labelled_histogram_without_series_yet_is_still_found(tmp_path: Path) -> None:
    with ScriptedServer(Script(has_histogram=True, histogram_label='model="fake"')) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 0
    assert bands_of(witness) == [(1, 1, "metrics", "PASS"), (4, 4, "metrics", "PASS")]


def test_aprenders_log_spelling(tmp_path: Path) -> None:
    log = tmp_path / "apr.log"
    log.write_text("")
    script = Script(log_path=log, log_spelling="[PMAT-044] Batch m={m} done", record_delay_s=0.05)
    with ScriptedServer(script) as server:
        code, witness = run_probe(server.url, tmp_path, "--server-log", str(log))
    assert code == 0 and bands_of(witness) == [(1, 1, "log", "PASS"), (4, 4, "log", "PASS")]


def test_the_log_is_preferred_to_the_histogram(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    with ScriptedServer(Script(log_path=log, has_histogram=True)) as server:
        code, witness = run_probe(server.url, tmp_path, "--server-log", str(log))
    assert code == 0 and [b["m_formed_source"] for b in witness["bands"]] == ["log", "log"]


@pytest.mark.parametrize("style", ["is_processing", "state"])
def test_llamacpp_slots_and_entries(tmp_path: Path, style: str) -> None:
    script = Script(slots_style=style, has_llama_gauge=True, entry_style="llamacpp", has_server_info=False)
    with ScriptedServer(script) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 0 and bands_of(witness) == [(1, 1, "slots", "PASS"), (4, 4, "slots", "PASS")]
    assert witness["server"] is None


def test_llamacpp_gauge_without_slots(tmp_path: Path) -> None:
    with ScriptedServer(Script(has_llama_gauge=True, entry_style="llamacpp")) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 0 and bands_of(witness) == [(1, 1, "metrics", "PASS"), (4, 4, "metrics", "PASS")]


def test_openai_entries_and_held_partial_characters(tmp_path: Path) -> None:
    script = Script(pick=split_character, entry_style="openai", has_histogram=True)
    with ScriptedServer(script) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 0 and witness["reference"]["tokens"] == 12
    assert all(s["refused"] is None for b in witness["bands"] for s in b["slots"])


def test_no_source_at_all_is_m_formed_0_and_unmeasurable(tmp_path: Path) -> None:
    with ScriptedServer(Script()) as server:
        code, witness = run_probe(server.url, tmp_path)
    assert code == 8
    assert bands_of(witness) == [(1, 0, None, "PASS"), (4, 0, None, "UNMEASURABLE")]
