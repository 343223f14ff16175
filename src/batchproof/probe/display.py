"""What the probe shows: live progress while it runs and the short report at the end."""

import sys
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn


class ProgressDisplay:
    """Phase by phase: a live display on a terminal, plain lines on stderr otherwise."""

    def __init__(self, is_live: bool | None = None) -> None:
        self._is_live = sys.stdout.isatty() if is_live is None else is_live
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> "ProgressDisplay":
        if self._is_live:
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("requests back"),
                TimeElapsedColumn(),
                console=Console(),
                transient=True,
            )
            self._progress.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()

    def note(self, line: str) -> None:
        if self._progress is not None:
            self._progress.console.print(line, highlight=False, markup=False)
        else:
            print(f"probe: {line}", file=sys.stderr, flush=True)

    def phase(self, label: str, total: int) -> None:
        if self._progress is not None:
            self._task = self._progress.add_task(label, total=total)
        else:
            print(f"probe: {label}: firing {total} request(s)", file=sys.stderr, flush=True)

    def request_done(self) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task)

    def phase_done(self, line: str) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.remove_task(self._task)
            self._task = None
        self.note(line)


def _or_dash(value: Any, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def band_line(band: dict[str, Any]) -> str:
    source = f" ({band['m_formed_source']})" if band.get("m_formed_source") else ""
    rate = band.get("decode_tok_s")
    reason = f" ({band['reason']})" if band.get("reason") else ""
    return (
        f"  c={band['c']} m_formed={band['m_formed']}{source} {band['result']} "
        f"intra_agree_to={_or_dash(band['intra_agree_to'])} "
        f"divergence_at={_or_dash(band['divergence_at'])} "
        f"top2_margin={_or_dash(band.get('top2_margin_at_divergence'), '.4g')} "
        f"decode={_or_dash(rate, '.1f')} tok/s{reason}"
    )


def report_lines(witness: dict[str, Any]) -> list[str]:
    """The verdict, the reference, then one line per band."""
    reference = witness["reference"]
    stable = "stable" if reference["stable"] else "NOT STABLE"
    why = f" ({reference['reason']})" if reference.get("reason") else ""
    return [
        f"batchproof probe: {witness['result']} (declared_min {witness['declared_min']}, "
        f"n_predict {witness['sampler']['max_tokens']})",
        f"  m=1 reference: {stable} tokens={_or_dash(reference['tokens'])} "
        f"self_divergence_at={_or_dash(reference['self_divergence_at'])}{why}",
        *(band_line(band) for band in witness["bands"]),
    ]
