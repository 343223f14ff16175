"""What the probe shows: live progress while it runs and the short report at the end."""

# Every line passes through `printable`: lines quote what the server sent (its error messages,
# replica ids, model name), and a server must not be able to drive the user's terminal.

import sys
from collections import Counter
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from batchproof.common.band import Band, read_band
from batchproof.common.printable import printable
from batchproof.probe.config import ProbeConfig
from batchproof.probe.judge.fleet import Listed
from batchproof.probe.judge.verdict import ReferenceJudgement
from batchproof.probe.mode import Mode
from batchproof.probe.wire.m_formed import MFormedWatcher


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
        line = printable(line)
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


def _additions(band: Band) -> str:
    """The v3 additions, when the band has them: worst slot, logprob parity, stream modes, the
    probe's own share of the machine's CPUs during the band."""
    parts = []
    slots = band.slots or []
    parted = any(
        s.get("divergence_at") is not None and s["divergence_at"] < (s.get("completion_tokens") or 0) for s in slots
    )
    if parted and band.divergence_slot is not None:
        parts.append(f"slot={band.divergence_slot}")
    if "logprobs_bitwise_equal" in band.keys():
        equal, diff = band.logprobs_bitwise_equal, band.logprob_max_abs_diff
        parts.append("logprobs=bitwise" if equal else f"logprobs={'differ' if equal is False else '?'}"
                     f" max_abs_diff={_or_dash(diff, '.3g')}")
    modes = Counter(s["stream_mode"] for s in slots if "stream_mode" in s)
    if modes:
        parts.append("streams=" + ",".join(f"{n} {mode}" for mode, n in sorted(modes.items())))
    if isinstance(band.probe_cpu_share, int | float):  # as read from another probe's witness: maybe not a number
        parts.append(f"probe_cpu={100 * band.probe_cpu_share:.0f}%")
    return "".join(f" {part}" for part in parts)


def band_line(band: Band, mode: Mode) -> str:
    """A band's line in the report; on a fleet, who served its slots."""
    source = f" ({band.m_formed_source})" if band.m_formed_source else ""
    served = mode.server.served(band)
    replicas = f" replicas={served}" if served is not None else ""
    reason = f" ({band.reason})" if band.reason else ""
    return (
        f"  c={band.c} m_formed={band.m_formed}{source} {band.result} "
        f"intra_agree_to={_or_dash(band.intra_agree_to)} "
        f"divergence_at={_or_dash(band.divergence_at)} "
        f"top2_margin={_or_dash(band.top2_margin_at_divergence, '.4g')} "
        f"decode={_or_dash(band.decode_tok_s, '.1f')} tok/s{_additions(band)}{replicas}{reason}"
    )


def band_done_line(band: Band, num_back: int, took_s: float, mode: Mode) -> str:
    """A band's progress line when its requests are back; on a fleet, who served them."""
    served = mode.server.served(band)
    on = f", on {served}" if served is not None else ""
    return f"band c={band.c}: {num_back}/{band.c} back in {took_s:.1f}s, m_formed={band.m_formed}{on}, {band.result}"


def conflict_lines(band: Band) -> list[str]:
    """A stream whose declared mode its arrival times contradict, one line each."""
    return [
        f"    c={band.c} slot {s['i']}: {s['stream_mode_conflict']}"
        for s in band.slots or []
        if s.get("stream_mode_conflict")
    ]


def fleet_lines(fleet: dict[str, Any]) -> list[str]:
    """The replicas that served, and whether they agree: divergence none, or the first one."""
    replicas = ", ".join(f"{r['id']} ({r['alone']} alone, {r['slots']} slots)" for r in fleet["replicas"])
    n = fleet["num_replicas"]
    lines = [f"  fleet: {fleet['result']}, {n} replica{'s' if n != 1 else ''}: {replicas or '-'}"]
    pairs = fleet["pairs_compared"]
    if fleet["divergence"] is None and pairs:
        lines.append(f"    cross-replica divergence: none ({pairs} pair{'s' if pairs != 1 else ''} compared, bitwise)")
    if fleet.get("reason"):
        lines.append(f"    {fleet['reason']}")
    numerics = {r["id"]: r["numerics_id"] for r in fleet["replicas"] if r.get("numerics_id")}
    if len(set(numerics.values())) > 1:
        lines.append("    numerics_id differ: " + ", ".join(f"{r} {v[:12]}" for r, v in numerics.items()))
    return lines


def reference_logprobs_part(reference: dict[str, Any]) -> str:
    """The reference's logprob stability, when the witness has it: bitwise, or the finding."""
    if reference.get("logprobs_stable") is True:
        return " logprobs=bitwise"
    if reference.get("logprobs_stable") is False:
        return f" logprobs NOT STABLE: {reference.get('logprob_reason')} (band logprob differences are not batching's)"
    return ""


def section_lines(name: str, section: dict[str, Any] | None, summary: str = "") -> list[str]:
    """A mode's verdict line and each of its findings (a not-attributable one says why)."""
    if section is None:
        return []
    why = f" ({section['reason']})" if section.get("reason") else ""
    findings = section.get("findings") or []
    blamed = [f for f in findings if f.get("attributable") is not False]
    others = len(findings) - len(blamed)
    more = [f"    and {others} difference(s) not attributable to {name} (in the witness)"] if others else []
    return [f"  {name}: {section['result']}{summary}{why}", *(f"    {f['text']}" for f in blamed), *more]


def cache_summary(cache: dict[str, Any] | None) -> str:
    if not cache or cache.get("num_warm_slots") is None:
        return ""
    hits = "cached_tokens unknown" if cache.get("num_hits") is None else f"{cache['num_hits']} hit"
    return f", {len(cache.get('cases') or [])} cases, {cache['num_warm_slots']} warm slots ({hits})"


def any_server_lines(witness: dict[str, Any]) -> list[str]:
    """What the server refused (and so was not asked) and the 200s that lacked their logprobs."""
    lines = []
    if witness.get("dropped_fields"):
        lines.append(f"  dropped fields (the server refused them): {', '.join(witness['dropped_fields'])}")
    for entry in witness.get("fail_open") or []:
        how = "streamed" if entry["streamed"] else "not streamed"
        lines.append(f"  FAIL-OPEN: {entry['route']} ({how}) answered {entry['requests']} request(s) "
                     f"with {entry['what']}")
    return lines


def report_lines(witness: dict[str, Any]) -> list[str]:
    """The verdict, the reference, one line per band, then on a fleet its replicas' agreement,
    then the other modes' sections and what any server refused or failed open on."""
    reference = witness["reference"]
    stable = "stable" if reference["stable"] else "NOT STABLE"
    why = f" ({reference['reason']})" if reference.get("reason") else ""
    fleet, mode = witness.get("fleet"), Mode.of_witness(witness)
    bands = [read_band(band) for band in witness["bands"]]
    lines = [
        f"batchproof probe: {witness['result']} (declared_min {witness['declared_min']}, "
        f"n_predict {witness['sampler']['max_tokens']})",
        f"  m=1 reference: {stable} tokens={_or_dash(reference['tokens'])} "
        f"self_divergence_at={_or_dash(reference['self_divergence_at'])}{why}"
        f"{reference_logprobs_part(witness.get('reference_logprobs') or {})}",
        *(line for band in bands for line in (band_line(band, mode), *conflict_lines(band))),
        *(fleet_lines(fleet) if fleet is not None else []),
        *section_lines("stream parity", witness.get("stream_parity")),
        *section_lines("cache", witness.get("cache"), cache_summary(witness.get("cache"))),
        *any_server_lines(witness),
    ]
    return [printable(line) for line in lines]


def references_label(num_prompts: int, plan: str = "") -> str:
    """The m=1 phase's name, with what the mode plans for it (on a fleet: each replica twice)."""
    label = "m=1 reference" if num_prompts == 1 else f"m=1 references ({num_prompts} prompts)"
    return label + plan


def reference_line(
    reference: ReferenceJudgement, num_prompts: int, served_alone: str, stability: dict[str, Any]
) -> str:
    """The m=1 phase's progress line: stable or why not, and (on a fleet) who served it."""
    state = "stable" if reference.is_stable else "NOT STABLE"
    why = f" ({reference.reason})" if reference.reason else ""
    if stability["logprob_reason"]:
        why += f"; logprobs NOT STABLE ({stability['logprob_reason']})"
    label = references_label(num_prompts)
    return f"{label}: {state}, self_divergence_at={reference.self_divergence_at}{served_alone}{why}"


def sources_line(config: ProbeConfig, watcher: MFormedWatcher, info: Any, listed: list[Listed] | None) -> str:
    """What the server offers the probe: server_info, a listed fleet, and where m_formed is read."""
    sources = [
        name
        for name, present in (
            ("server log", config.server_log is not None),
            ("/metrics batch_size histogram", watcher.has_histogram),
            ("/slots", watcher.has_slots),
            ("/metrics requests-running gauge", watcher.has_gauge),
        )
        if present
    ]
    has_info = "has" if isinstance(info, dict) else "no"
    m_from = ", ".join(sources) or "nothing (m_formed 0)"
    fleet = ""
    if listed:
        fleet = f"; lists {len(listed)} replicas ({sum(r.is_alive for r in listed)} alive)"
    elif listed is not None:
        fleet = "; lists no fleet replicas"
    return f"{config.url}: {has_info} /v1/server_info{fleet}; m_formed from {m_from}"
