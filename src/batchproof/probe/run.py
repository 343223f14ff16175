"""The run: m=1 references (one per prompt, twice each; on a fleet, until each replica has
answered twice), then each band of c concurrent requests, then on a fleet the replicas' agreement."""

import asyncio
import dataclasses
import os
import time
from typing import Any

import httpx

from batchproof.common.band import Band
from batchproof.probe.config import ProbeConfig
from batchproof.probe.display import (
    ProgressDisplay,
    band_done_line,
    reference_line,
    references_label,
    sources_line,
)
from batchproof.probe.judge.cache import cache_cases, cache_record, judge_case, measure_case
from batchproof.probe.judge.fail_open import fail_open_record
from batchproof.probe.judge.fleet import Listed, with_fleet
from batchproof.probe.judge.pair import band_noise
from batchproof.probe.judge.references import as_reference, judge_alone, sample
from batchproof.probe.judge.stream_parity import fetch_whole_band, judge_pairs, stream_parity_record
from batchproof.probe.judge.verdict import Policy, ReferenceJudgement, run_verdict
from batchproof.probe.matrix import Matrix
from batchproof.probe.records.message import Message
from batchproof.probe.records.reply import StreamResult
from batchproof.probe.wire.discovery import first_model, get_json
from batchproof.probe.wire.droppable_fields import negotiate, without
from batchproof.probe.wire.m_formed import MFormedWatcher
from batchproof.probe.wire.request import ROUTES, request_body
from batchproof.probe.wire.stream import StreamRequest, fire
from batchproof.probe.witness import RunRecord, band_record, slot_record

Fired = list[tuple[int, list[int], list[StreamResult]]]  # per band: c, each slot's prompt, its reply


def fired_prompts(config: ProbeConfig, matrix: Matrix, prompts: tuple[str, ...]) -> tuple[str, ...]:
    """The prompts a run fires (and references): one, or in mixed mode the first max(ladder)."""
    return config.mode.prompts.fired(prompts, matrix.ladder)


def headers(config: ProbeConfig) -> dict[str, str]:
    return {} if config.api_key is None else {"Authorization": f"Bearer {config.api_key}"}


class Prober:
    """One run against one server; holds what every band shares."""

    def __init__(
        self, config: ProbeConfig, matrix: Matrix, progress: ProgressDisplay, prompts: tuple[str, ...] | None = None
    ) -> None:
        self.config = config
        self.mode = config.mode
        self.matrix = matrix
        self.progress = progress
        self.policy = Policy(matrix.n_predict, matrix.min_agree_tokens, matrix.max_constant_run)
        self.prompts = fired_prompts(config, matrix, prompts or config.prompt_set())
        self.served_model: str | None = None
        self.dropped: list[str] = []  # fields the server refused, left out of every request
        self.fired: list[StreamResult] = []  # every reply, for the fail-open census

    async def run(self) -> RunRecord:
        config = self.config
        async with httpx.AsyncClient(base_url=config.url, headers=headers(config), timeout=10.0) as client:
            try:
                info = await get_json(client, "/v1/server_info")
            except (httpx.ConnectError, httpx.ConnectTimeout) as err:
                why = str(err) or type(err).__name__
                return _unreachable(None, f"cannot connect to {config.url} ({why})")
            info = info if isinstance(info, dict) else None
            served_model = config.served_model or await first_model(client)
            watcher = MFormedWatcher(client, config.server_log, config.settle_s, config.poll_s)
            await watcher.detect()
            listed = self.mode.server.listed(info)
            self.progress.note(sources_line(config, watcher, info, listed))
            self.served_model = served_model
            record = await self._measure(watcher, [self._request(prompt) for prompt in self.prompts], listed)
            return dataclasses.replace(record, server_info=info, served_model=served_model)

    def _request(self, prompt: str | list[Message]) -> StreamRequest:
        """The request for a prompt (or a conversation), without the fields the server refused."""
        config = self.config
        body = request_body(config.route, prompt, self.matrix, self.served_model, config.extra_body)
        request = StreamRequest(url=f"{config.url}{ROUTES[config.route]}", body=body, headers=headers(config),
                                timeout_s=config.timeout_s)
        return without(request, self.dropped)

    async def _measure(
        self, watcher: MFormedWatcher, requests: list[StreamRequest], listed: list[Listed] | None
    ) -> RunRecord:
        # A server that refuses a field the probe can do without gets every request without it.
        (first_request, self.dropped, first), *_ = await watcher.measure(negotiate(requests[0], self._tracked))
        requests = [first_request, *(without(r, self.dropped) for r in requests[1:])]
        alone = await self._references(watcher, requests, listed, first)
        if alone[-1][-1].is_unreachable:
            return _unreachable(None, alone[-1][-1].error or "")
        server = self.mode.server
        groups = server.groups(alone)
        reference, records, stability = judge_alone(groups, [server.label(g, len(alone)) for g in groups], self.policy)
        self.progress.phase_done(reference_line(reference, len(alone), server.served_alone(alone), stability))
        bands: list[Band] = []
        fired: Fired = []
        if reference.is_stable and not server.is_nameless(alone):
            for c in self.matrix.ladder:
                band, prompts, results = await self._band(c, watcher, requests, alone, stability["logprobs_stable"])
                bands.append(band)
                fired.append((c, prompts, results))
        sections = await self._sections(requests, alone, records, bands, fired, reference, listed)
        verdict = run_verdict(reference.is_stable, [(b.c, b.result) for b in bands])
        for section in sections.values():
            verdict = with_fleet(verdict, section["result"])
        fail_open = await self._fail_open(requests[0])
        if fail_open:
            verdict = "FAIL"  # asked for logprobs, answered 200 without: never a pass, never unmeasurable
        return RunRecord(None, None, reference, bands, verdict, references=records, reference_logprobs=stability,
                         fail_open=fail_open, dropped_fields=list(self.dropped), **sections)

    async def _sections(
        self, requests: list[StreamRequest], alone: list[list[StreamResult]], records: list[dict[str, Any]],
        bands: list[Band], fired: Fired, reference: ReferenceJudgement, listed: list[Listed] | None,
    ) -> dict[str, dict[str, Any]]:
        """The witness's sections beyond the bands, each with a result the run's verdict takes in:
        on a fleet the replicas' agreement, and --stream-parity and --cache when asked."""
        sections = {}
        fleet = self.mode.server.agreement(alone, bands, listed, self.matrix.n_predict)
        if fleet is not None:
            sections["fleet"] = fleet
        if self.config.is_stream_parity:
            sections["stream_parity"] = await self._stream_parity(requests, alone, records, bands, fired, reference)
        if self.config.is_cache:
            sections["cache"] = await self._cache(bands, reference)
        return sections

    async def _fail_open(self, request: StreamRequest) -> list[dict[str, Any]]:
        """Every reply that came back 200 without logprobs, by way of asking; when only streams
        were asked and one failed open, one whole request shows whether the other path does too."""
        if any(r.is_fail_open for r in self.fired) and all(r.is_streamed for r in self.fired):
            await self._tracked(request, is_streamed=False)
        return fail_open_record(self.fired, ROUTES[self.config.route])

    async def _stream_parity(
        self, requests: list[StreamRequest], alone: list[list[StreamResult]], records: list[dict[str, Any]],
        bands: list[Band], fired: Fired, reference: ReferenceJudgement,
    ) -> dict[str, Any]:
        """Each prompt's first m=1 run and every band slot, fetched again whole and compared."""
        if not reference.is_stable:
            return _not_measured("stream-parity")
        self.progress.phase("stream parity (whole replies)", len(requests) + sum(c for c, _, _ in fired))
        pairs = []
        for p, request in enumerate(requests):
            whole = await self._tracked(request, is_streamed=False)
            stable = next((r["logprobs_bitwise_equal"] for r in records if r["prompt"] == p), None)
            why_not = None if stable is True else f"two alone runs of prompt {p} already differ"
            label = "m=1" if len(requests) == 1 else f"m=1 prompt {p}"
            pairs.append((label, alone[p][0], whole, why_not))
        for c, prompts, streamed in fired:
            wholes = await fetch_whole_band(prompts, lambda p: self._tracked(requests[p], is_streamed=False))
            pairs += [(f"c={c} slot {i}", s, w, band_noise(bands, c)) for i, (s, w) in enumerate(zip(streamed, wholes))]
        section = stream_parity_record(*judge_pairs(pairs, self.matrix.n_predict))
        self.progress.phase_done(f"stream parity: {section['result']}" + _why(section))
        return section

    async def _cache(self, bands: list[Band], reference: ReferenceJudgement) -> dict[str, Any]:
        """Per cache case: cold, a warmer sharing a long prefix, warm alone twice and in bands."""
        if not reference.is_stable:
            return _not_measured("cache")
        cases = cache_cases(self.prompts[0])
        per_case = 3 + 2 + sum(c for c in self.matrix.ladder if c > 1)
        self.progress.phase(f"cache ({len(cases)} cases: cold, warmer, warm)", per_case * len(cases))
        judged = []
        for case in cases:
            cold, warmer, warm = await measure_case(case, lambda m: self._tracked(self._request(m)), self.matrix.ladder)
            judged.append(judge_case(case, cold, warmer, warm, self.matrix.n_predict, lambda c: band_noise(bands, c)))
        section = cache_record(judged)
        self.progress.phase_done(f"cache: {section['result']}, {section['num_hits']} of "
                                 f"{section['num_warm_slots']} warm slots hit" + _why(section))
        return section

    async def _references(
        self, watcher: MFormedWatcher, requests: list[StreamRequest], listed: list[Listed] | None,
        first: StreamResult,
    ) -> list[list[StreamResult]]:
        """Each prompt's m=1 runs, in the order they came back, as many as the mode wants (two; on a
        fleet until every replica seen and listed alive has answered twice). `first` is prompt 0's
        first run, already fired (by the field negotiation)."""
        # One at a time, each waiting for its batch record, so none leaks into a band.
        server = self.mode.server
        label = references_label(len(requests), server.alone_plan)
        self.progress.phase(label, server.alone_cap(listed) * len(requests))
        alone: list[list[StreamResult]] = []
        for request in requests:
            runs: list[StreamResult] = []
            alone.append(runs)
            while not runs or server.wants_another(runs, listed):
                if alone[1:] or runs:
                    run, *_ = await watcher.measure(self._tracked(request), _named)
                else:
                    run = first
                runs.append(run)
                if run.is_unreachable:
                    return alone
        return alone

    async def _band(
        self, c: int, watcher: MFormedWatcher, requests: list[StreamRequest], alone: list[list[StreamResult]],
        is_reference_logprob_stable: bool | None = None,
    ) -> tuple[Band, list[int], list[StreamResult]]:
        """The band, and which prompt each slot asked and what it got (for stream parity)."""
        self.progress.phase(f"band c={c}", c)
        config, start, cpu_start = self.config, time.perf_counter(), time.process_time()
        prompts = [i % len(requests) for i in range(c)]
        stagger_s = config.stagger_ms / 1000
        work = asyncio.gather(*(self._tracked(requests[p], i * stagger_s) for i, p in enumerate(prompts)))
        results, m_formed, source, by_replica = await watcher.measure(work, _all_named)
        references = [self.mode.server.reference_for(alone[p], r.replica) for p, r in zip(prompts, results)]
        slots = [slot_record(p, r, ref, self.matrix.n_predict) for p, r, ref in zip(prompts, results, references)]
        judgement, worst = self.mode.judge_band(c, m_formed, [as_reference(ref) for ref in references],
                                                [sample(r) for r in results], [r.replica for r in results],
                                                self.policy)
        took_s = time.perf_counter() - start
        band = band_record(c, m_formed, source, judgement, slots, self.matrix, worst, by_replica,
                           is_reference_logprob_stable, cpu_share(time.process_time() - cpu_start, took_s))
        self.progress.phase_done(band_done_line(band, len(results), took_s, self.mode))
        return band, prompts, list(results)

    async def _tracked(self, request: StreamRequest, delay_s: float = 0.0, is_streamed: bool = True) -> StreamResult:
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        result = await fire(request, is_streamed)
        self.fired.append(result)
        self.progress.request_done()
        return result


def cpu_share(cpu_s: float, wall_s: float) -> float | None:
    """CPU seconds over wall seconds times the cores this process may run on (0 to 1), None
    without a span. process_time counts every thread of the probe, the display's included."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return round(min(1.0, cpu_s / (wall_s * cores)), 4) if wall_s > 0 else None


def _named(result: StreamResult) -> list[str]:
    return [] if result.replica is None else [result.replica]


def _all_named(results: list[StreamResult]) -> list[str]:
    return [r.replica for r in results if r.replica is not None]


def _unreachable(served_model: str | None, why: str) -> RunRecord:
    reference = ReferenceJudgement(False, None, None, f"server unreachable: {why}")
    return RunRecord(None, served_model, reference, [], "UNMEASURABLE", unreachable=why)


def _not_measured(mode: str) -> dict[str, Any]:
    why = "the m=1 reference is not stable"
    return {"result": "UNMEASURABLE", "reason": f"{mode} not measured: {why}", "findings": []}


def _why(section: dict[str, Any]) -> str:
    return f" ({section['reason']})" if section.get("reason") else ""
