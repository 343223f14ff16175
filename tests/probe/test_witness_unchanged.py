"""The probe's witness and report against a scripted server, the same as before the mode was
typed (issue 24): identical, mixed, fleet and mixed on a fleet, with times and ports normalised.

The fixture was recorded before the refactor by running this module as a script:
`python -m tests.probe.test_witness_unchanged` (it rewrites tests/probe/fixtures/witness-before.json).
"""

import json
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.quirky_server import Quirks, QuirkyServer
from tests.helpers.scripted_server import Script, ScriptedServer, near_tie_flip, run_probe

FIXTURE = Path(__file__).parent / "fixtures" / "witness-before.json"
FLEET = {"replicas": ("r0", "r1"), "listed_replicas": ("r0", "r1"), "has_histogram": True}
PROMPTS = "first prompt\nsecond, longer prompt\n"
# name -> (the server, the probe's options); "PROMPTS" stands for a file of PROMPTS.
CASES: dict[str, tuple[Callable[[], ScriptedServer], tuple[str, ...]]] = {
    "identical": (lambda: ScriptedServer(Script(pick=near_tie_flip(3, 0.01), has_histogram=True)), ()),
    "identical-stream-parity-cache": (lambda: QuirkyServer(quirks=Quirks(warm_shift=1e-6)),
                                      ("--stream-parity", "--cache")),
    "mixed": (lambda: ScriptedServer(Script(mixed_divergence_at=3, token_delay_s=0.005, has_histogram=True)),
              ("--mixed",)),
    "fleet": (lambda: ScriptedServer(Script(**FLEET, replica_logprob_shift=("r1", 5, 1e-6))), ("--fleet",)),
    "fleet-nameless": (lambda: ScriptedServer(Script(has_histogram=True)), ("--fleet",)),
    "mixed-fleet": (lambda: ScriptedServer(Script(**FLEET)), ("--fleet", "--mixed", "--prompts", "PROMPTS")),
}
TIMES = [
    (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:PORT"),
    (re.compile(r"in \d+\.\ds"), "in T s"),
    # No rate ("-") where a stream's chunks came in one burst: the machine's load decides that too.
    (re.compile(r"decode=(\d+\.\d|-) tok/s"), "decode=R tok/s"),
    # The probe's own CPU share (added after the fixture was recorded): the machine decides it.
    (re.compile(r" probe_cpu=\d+%"), ""),
]


def untimed(value: Any) -> Any:
    """`value` with every decode rate null and no probe CPU share: a run's timing decides them
    (the share was added after the fixture was recorded)."""
    if isinstance(value, dict):
        return {k: None if k == "decode_tok_s" else untimed(v) for k, v in value.items() if k != "probe_cpu_share"}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def normalised(witness: dict[str, Any] | None) -> dict[str, Any] | None:
    """The witness without what the machine decides: decode rates and, on a fleet, which slot of a
    band arrived at which replica first (the replicas' counts per band stay, as a sorted list)."""
    witness = untimed(witness)
    if witness is None or witness["fleet"] is None:
        return witness
    for band in witness["bands"]:
        band["served"] = sorted([s.pop("replica"), s.pop("reference_replica")] for s in band["slots"])
    return witness


STREAMS = re.compile(r" streams=\d+ \w+(,\d+ \w+)*")
CONFLICT = re.compile(r"^    c=\d+ slot \d+: declared stream_mode")


def unhurried(case: dict[str, Any]) -> dict[str, Any]:
    """A recorded case without what a busy machine decides: whether each stream's chunks arrived
    spread out (live) or in one burst (buffered), in the witness and in the report."""
    witness = case["witness"]
    for band in witness["bands"] if witness else []:
        for slot in band["slots"]:
            slot["stream_mode"] = slot["stream_mode_conflict"] = None
    report = [STREAMS.sub(" streams=S", line) for line in case["report"] if not CONFLICT.match(line)]
    return {**case, "report": report}


def lines(text: str) -> list[str]:
    for pattern, replacement in TIMES:
        text = pattern.sub(replacement, text)
    return text.splitlines()


def probe_case(name: str, tmp_path: Path, capsys: Any) -> dict[str, Any]:
    """(exit code, normalised witness, report lines, progress lines) of one case."""
    serve, options = CASES[name]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPTS)
    options = tuple(str(prompts) if o == "PROMPTS" else o for o in options)
    capsys.readouterr()
    with serve() as server:
        code, witness = run_probe(server.url, tmp_path, *options)
    out, err = capsys.readouterr()
    return {"code": code, "witness": normalised(witness), "report": lines(out), "progress": lines(err)}


@pytest.mark.parametrize("name", list(CASES))
def test_the_probe_writes_the_witness_it_wrote_before(name: str, tmp_path: Path, capsys: Any) -> None:
    before = json.loads(FIXTURE.read_text(encoding="utf-8"))[name]
    after = probe_case(name, tmp_path, capsys)
    after["report"] = [line.replace(str(tmp_path), "TMP") for line in after["report"]]
    after["progress"] = [line.replace(str(tmp_path), "TMP") for line in after["progress"]]
    assert unhurried(after) == unhurried(before)


class _Capture:
    """capsys for a run outside pytest: what the probe printed, read from redirected streams."""

    def __init__(self) -> None:
        import io

        self.out, self.err = io.StringIO(), io.StringIO()

    def readouterr(self) -> tuple[str, str]:
        out, err = self.out.getvalue(), self.err.getvalue()
        self.out.seek(0), self.out.truncate(), self.err.seek(0), self.err.truncate()
        return out, err


def record() -> None:
    import contextlib

    recorded = {}
    for name in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            capture = _Capture()
            with contextlib.redirect_stdout(capture.out), contextlib.redirect_stderr(capture.err):
                case = probe_case(name, Path(tmp), capture)
            case["report"] = [line.replace(tmp, "TMP") for line in case["report"]]
            case["progress"] = [line.replace(tmp, "TMP") for line in case["progress"]]
            recorded[name] = case
    FIXTURE.write_text(json.dumps(recorded, indent=1) + "\n", encoding="utf-8")
    print(f"recorded {len(recorded)} cases in {FIXTURE}", file=sys.__stderr__)


if __name__ == "__main__":
    record()
