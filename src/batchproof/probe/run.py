"""The run: m=1 references (one per prompt, twice each; on a fleet, until each replica has
answered twice), then each band of c concurrent requests, then on a fleet the replicas' agreement."""

import asyncio
import dataclasses
import time
from collections import Counter
from typing import Any

import httpx

from batchproof.probe.cache import cache_cases, cache_record, judge_case, measure_case
from batchproof.probe.config import ProbeConfig
from batchproof.probe.display import ProgressDisplay, served_by
from batchproof.probe.fail_open import fail_open_record
from batchproof.probe.fields import negotiate, without
from batchproof.probe.fleet import (
    Listed,
    alone_cap,
    fleet_record,
    judge_fleet,
    listed_replicas,
    needs_more_alone,
    with_fleet,
)
from batchproof.probe.fleet_band import judge_fleet_band
from batchproof.probe.logprob_parity import UNMEASURED, compare
from batchproof.probe.m_formed import MFormedWatcher
from batchproof.probe.matrix import Matrix
from batchproof.probe.mixed_verdict import judge_mixed_band
from batchproof.probe.pair import band_noise
from batchproof.probe.references import (
    alone_groups,
    as_reference,
    fleet_replies,
    group_record,
    judge_runs,
    judged_reference,
    logprob_stability,
    reference_for,
    sample,
)
from batchproof.probe.request import ROUTES, Message, request_body
from batchproof.probe.stream import StreamRequest, StreamResult, fire
from batchproof.probe.stream_parity import fetch_whole_band, judge_pairs, stream_parity_record
from batchproof.probe.verdict import (
    Policy,
    ReferenceJudgement,
    judge_band,
    refusal,
    run_verdict,
    slot_divergence,
)
from batchproof.probe.witness import RunRecord, SlotRecord, band_record


def fired_prompts(config: ProbeConfig, matrix: Matrix, prompts: tuple[str, ...]) -> tuple[str, ...]:
    """The prompts a run fires: slot i of a mixed band asks prompt i (cycling), so only the
    first max(ladder) are used (and referenced); identical mode fires one."""
    return prompts[: max(matrix.ladder)] if config.is_mixed else prompts[:1]


def headers(config: ProbeConfig) -> dict[str, str]:
    return {} if config.api_key is None else {"Authorization": f"Bearer {config.api_key}"}


def slot_record(prompt: int, result: StreamResult, reference: StreamResult, n_predict: int) -> SlotRecord:
    """A slot against its own prompt's reference: where it parts, and its logprobs until then."""
    refused = refusal(sample(result), n_predict)
    mode, conflict = result.mode
    divergence, margin, parity = None, None, UNMEASURED
    if refused is None:
        ref = as_reference(reference)
        divergence, margin = slot_divergence(ref.identities, ref.margins, sample(result).identities)
        parity = compare(reference.logprob_vectors(), result.logprob_vectors(), divergence)
    return SlotRecord(
        completion_tokens=result.completion_tokens,
        finish_reason=result.finish_reason,
        refused=refused,
        decode_tok_s=result.decode_tok_s,
        prompt=prompt,
        stream_mode=mode,
        stream_mode_conflict=conflict,
        divergence_at=divergence,
        top2_margin_at_divergence=margin,
        logprob_max_abs_diff=parity.max_abs_diff,
        logprobs_bitwise_equal=parity.is_bitwise_equal,
        logprob_first_diff_at=parity.first_diff_at,
        replica=result.replica,
        reference_replica=reference.replica,
    )


class Prober:
    """One run against one server; holds what every band shares."""

    def __init__(
        self, config: ProbeConfig, matrix: Matrix, progress: ProgressDisplay, prompts: tuple[str, ...] | None = None
    ) -> None:
        self.config = config
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
                info = await _get_json(client, "/v1/server_info")
            except (httpx.ConnectError, httpx.ConnectTimeout) as err:
                why = str(err) or type(err).__name__
                return _unreachable(None, f"cannot connect to {config.url} ({why})")
            info = info if isinstance(info, dict) else None
            served_model = config.served_model or await _first_model(client)
            watcher = MFormedWatcher(client, config.server_log, config.settle_s, config.poll_s)
            await watcher.detect()
            listed = listed_replicas(info) if config.is_fleet else None
            self.progress.note(_sources_line(config, watcher, info, listed))
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
        is_fleet, n_predict = self.config.is_fleet, self.matrix.n_predict
        groups = alone_groups(alone, is_fleet)
        judged = [(g, judge_runs([sample(run) for run in g.runs], self.policy)) for g in groups]
        reference = judged_reference(judged, len(alone), is_fleet)
        records = [group_record(g, j) for g, j in judged]
        stability = logprob_stability(records)
        self.progress.phase_done(_reference_line(reference, len(alone), alone if is_fleet else None, stability))
        # A fleet whose replies name no replica cannot be measured as one: stop before the bands.
        is_nameless = is_fleet and all(run.replica is None for runs in alone for run in runs)
        bands: list[dict[str, Any]] = []
        fired: list[tuple[int, list[int], list[StreamResult]]] = []
        if reference.is_stable and not is_nameless:
            for c in self.matrix.ladder:
                band, prompts, results = await self._band(c, watcher, requests, alone, stability["logprobs_stable"])
                bands.append(band)
                fired.append((c, prompts, results))
        verdict = run_verdict(reference.is_stable, [(b["c"], b["result"]) for b in bands])
        fleet = None
        if is_fleet:
            slot_replicas = [s["replica"] for b in bands for s in b["slots"]]
            judgement = judge_fleet(fleet_replies(alone, n_predict), slot_replicas, listed)
            verdict = with_fleet(verdict, judgement.result)
            fleet = fleet_record(judgement)
        modes: dict[str, Any] = {}
        if self.config.is_stream_parity:
            modes["stream_parity"] = await self._stream_parity(requests, alone, records, bands, fired, reference)
        if self.config.is_cache:
            modes["cache"] = await self._cache(bands, reference)
        for section in modes.values():
            verdict = with_fleet(verdict, section["result"])
        fail_open = await self._fail_open(requests[0])
        if fail_open:
            verdict = "FAIL"  # asked for logprobs, answered 200 without: never a pass, never unmeasurable
        return RunRecord(None, None, reference, bands, verdict, references=records, fleet=fleet,
                         reference_logprobs=stability, fail_open=fail_open, dropped_fields=list(self.dropped),
                         **modes)

    async def _fail_open(self, request: StreamRequest) -> list[dict[str, Any]]:
        """Every reply that came back 200 without logprobs, by way of asking; when only streams
        were asked and one failed open, one whole request shows whether the other path does too."""
        if any(r.is_fail_open for r in self.fired) and all(r.is_streamed for r in self.fired):
            await self._tracked(request, is_streamed=False)
        return fail_open_record(self.fired, ROUTES[self.config.route])

    async def _stream_parity(
        self, requests: list[StreamRequest], alone: list[list[StreamResult]], records: list[dict[str, Any]],
        bands: list[dict[str, Any]], fired: list[tuple[int, list[int], list[StreamResult]]],
        reference: ReferenceJudgement,
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

    async def _cache(self, bands: list[dict[str, Any]], reference: ReferenceJudgement) -> dict[str, Any]:
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
        """Each prompt's m=1 runs, in the order they came back: two, or on a fleet until every
        replica seen (and listed alive) has answered twice (at most alone_cap). `first` is prompt
        0's first run, already fired (by the field negotiation)."""
        # One at a time, each waiting for its batch record, so none leaks into a band.
        is_fleet = self.config.is_fleet
        per_prompt = alone_cap(listed) if is_fleet else 2
        self.progress.phase(_references_label(len(requests), is_fleet), per_prompt * len(requests))
        alone: list[list[StreamResult]] = []
        for request in requests:
            runs: list[StreamResult] = []
            alone.append(runs)
            while True:
                if not alone[1:] and not runs:
                    run = first
                else:
                    run, *_ = await watcher.measure(self._tracked(request), _named)
                runs.append(run)
                if run.is_unreachable:
                    return alone
                if is_fleet and run.error is not None:
                    break  # the reference is refused; more runs would not change that
                replicas = [r.replica for r in runs]
                if not (needs_more_alone(replicas, listed) if is_fleet else len(runs) < 2):
                    break
        return alone

    async def _band(
        self, c: int, watcher: MFormedWatcher, requests: list[StreamRequest], alone: list[list[StreamResult]],
        is_reference_logprob_stable: bool | None = None,
    ) -> tuple[dict[str, Any], list[int], list[StreamResult]]:
        """The band's record, and which prompt each slot asked and what it got (for stream parity)."""
        self.progress.phase(f"band c={c}", c)
        config, start = self.config, time.perf_counter()
        prompts = [i % len(requests) for i in range(c)]
        stagger_s = config.stagger_ms / 1000
        work = asyncio.gather(*(self._tracked(requests[p], i * stagger_s) for i, p in enumerate(prompts)))
        results, m_formed, source, by_replica = await watcher.measure(work, _all_named)
        references = [reference_for(alone, p, r.replica, config.is_fleet) for p, r in zip(prompts, results)]
        slots = [slot_record(p, r, ref, self.matrix.n_predict) for p, r, ref in zip(prompts, results, references)]
        samples = [sample(r) for r in results]
        if config.is_fleet:
            refs = [as_reference(ref) for ref in references]
            replicas = [r.replica for r in results]
            judgement, worst = judge_fleet_band(c, m_formed, refs, samples, replicas, self.policy, config.is_mixed)
        elif config.is_mixed:
            refs = [as_reference(ref) for ref in references]
            judgement, _, worst = judge_mixed_band(c, m_formed, refs, samples, self.policy)
        else:
            ref = as_reference(references[0])
            judgement, worst = judge_band(c, m_formed, ref.identities, ref.margins, samples, self.policy), 0
        band = band_record(c, m_formed, source, judgement, slots, self.matrix, worst, by_replica,
                           is_reference_logprob_stable)
        took = time.perf_counter() - start
        on = f", on {served_by(band)}" if config.is_fleet else ""
        summary = f"{len(results)}/{c} back in {took:.1f}s, m_formed={m_formed}{on}, {band['result']}"
        self.progress.phase_done(f"band c={c}: {summary}")
        return band, prompts, list(results)

    async def _tracked(self, request: StreamRequest, delay_s: float = 0.0, is_streamed: bool = True) -> StreamResult:
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        result = await fire(request, is_streamed)
        self.fired.append(result)
        self.progress.request_done()
        return result


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


def _references_label(num_prompts: int, is_fleet: bool = False) -> str:
    label = "m=1 reference" if num_prompts == 1 else f"m=1 references ({num_prompts} prompts)"
    return f"{label}, each replica twice (at most)" if is_fleet else label


def _reference_line(
    reference: ReferenceJudgement, num_prompts: int, alone: list[list[StreamResult]] | None,
    stability: dict[str, Any] | None = None,
) -> str:
    state = "stable" if reference.is_stable else "NOT STABLE"
    why = f" ({reference.reason})" if reference.reason else ""
    if stability and stability["logprob_reason"]:
        why += f"; logprobs NOT STABLE ({stability['logprob_reason']})"
    label = _references_label(num_prompts)
    served = ""
    if alone is not None:
        counts = Counter(run.replica or "(unnamed)" for runs in alone for run in runs)
        served = ", served alone by " + ", ".join(f"{replica} x{n}" for replica, n in counts.items())
    return f"{label}: {state}, self_divergence_at={reference.self_divergence_at}{served}{why}"


def _sources_line(config: ProbeConfig, watcher: MFormedWatcher, info: Any, listed: list[Listed] | None) -> str:
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


async def _get_json(client: httpx.AsyncClient, path: str) -> Any:
    """The JSON at `path`, or None; only a refused connection is raised."""
    try:
        response = await client.get(path)
        return response.json() if response.is_success else None
    except (httpx.ConnectError, httpx.ConnectTimeout):
        raise
    except (httpx.HTTPError, ValueError):
        return None


async def _first_model(client: httpx.AsyncClient) -> str | None:
    """The served model's id from /v1/models, so servers that check `model` accept us."""
    try:
        doc = await _get_json(client, "/v1/models")
    except httpx.HTTPError:
        return None
    data = doc.get("data") if isinstance(doc, dict) else None
    first = data[0] if isinstance(data, list) and data else None
    return first["id"] if isinstance(first, dict) and isinstance(first.get("id"), str) else None
