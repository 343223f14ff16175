"""The run: m=1 references (one per prompt, twice each), then each band of c concurrent requests."""

import asyncio
import dataclasses
import time
from typing import Any

import httpx

from batchproof.probe.config import ProbeConfig
from batchproof.probe.display import ProgressDisplay
from batchproof.probe.logprob_parity import UNMEASURED, compare
from batchproof.probe.m_formed import MFormedWatcher
from batchproof.probe.matrix import Matrix
from batchproof.probe.mixed_verdict import Reference, judge_mixed_band
from batchproof.probe.references import combined, prompt_reference_record
from batchproof.probe.request import ROUTES, request_body
from batchproof.probe.stream import StreamRequest, StreamResult, fire
from batchproof.probe.verdict import (
    Policy,
    ReferenceJudgement,
    Sample,
    judge_band,
    judge_reference,
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


def sample(result: StreamResult) -> Sample:
    identities = [entry.identity for entry in result.entries]
    return Sample(identities, result.completion_tokens, result.error)


def as_reference(result: StreamResult) -> Reference:
    return Reference([e.identity for e in result.entries], [e.top2_margin for e in result.entries])


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
            self.progress.note(_sources_line(config, watcher, info))
            requests = [
                StreamRequest(
                    url=f"{config.url}{ROUTES[config.route]}",
                    body=request_body(config.route, prompt, self.matrix, served_model),
                    headers=headers(config),
                    timeout_s=config.timeout_s,
                )
                for prompt in self.prompts
            ]
            record = await self._measure(watcher, requests)
            return dataclasses.replace(record, server_info=info, served_model=served_model)

    async def _measure(self, watcher: MFormedWatcher, requests: list[StreamRequest]) -> RunRecord:
        refs = await self._references(watcher, requests)
        if refs[-1][0].is_unreachable:
            return _unreachable(None, refs[-1][0].error or "")
        judgements = [judge_reference(sample(a), sample(b), self.policy) for a, b in refs]
        reference = combined(judgements)
        records = [
            prompt_reference_record(i, j, compare(a.logprob_vectors(), b.logprob_vectors(), j.self_divergence_at or 0))
            for i, (j, (a, b)) in enumerate(zip(judgements, refs))
        ]
        self.progress.phase_done(_reference_line(reference, len(refs)))
        bands: list[dict[str, Any]] = []
        if reference.is_stable:
            for c in self.matrix.ladder:
                bands.append(await self._band(c, watcher, requests, [a for a, _ in refs]))
        verdict = run_verdict(reference.is_stable, [(b["c"], b["result"]) for b in bands])
        return RunRecord(None, None, reference, bands, verdict, references=records)

    async def _references(
        self, watcher: MFormedWatcher, requests: list[StreamRequest]
    ) -> list[tuple[StreamResult, StreamResult]]:
        # One at a time, each waiting for its batch record, so none leaks into a band.
        self.progress.phase("m=1 reference" if len(requests) == 1 else f"m=1 references ({len(requests)} prompts)",
                            2 * len(requests))
        refs = []
        for request in requests:
            first, _, _ = await watcher.measure(self._tracked(request))
            if first.is_unreachable:
                return [*refs, (first, first)]
            second, _, _ = await watcher.measure(self._tracked(request))
            refs.append((first, second))
        return refs

    async def _band(
        self, c: int, watcher: MFormedWatcher, requests: list[StreamRequest], references: list[StreamResult]
    ) -> dict[str, Any]:
        self.progress.phase(f"band c={c}", c)
        start = time.perf_counter()
        prompts = [i % len(requests) for i in range(c)]
        stagger_s = self.config.stagger_ms / 1000
        work = asyncio.gather(*(self._tracked(requests[p], i * stagger_s) for i, p in enumerate(prompts)))
        results, m_formed, source = await watcher.measure(work)
        slots = [slot_record(p, r, references[p], self.matrix.n_predict) for p, r in zip(prompts, results)]
        if self.config.is_mixed:
            refs = [as_reference(references[p]) for p in prompts]
            judgement, _, worst = judge_mixed_band(c, m_formed, refs, [sample(r) for r in results], self.policy)
        else:
            ref = as_reference(references[0])
            samples = [sample(r) for r in results]
            judgement, worst = judge_band(c, m_formed, ref.identities, ref.margins, samples, self.policy), 0
        band = band_record(c, m_formed, source, judgement, slots, self.matrix, worst)
        took = time.perf_counter() - start
        summary = f"{len(results)}/{c} back in {took:.1f}s, m_formed={m_formed}, {band['result']}"
        self.progress.phase_done(f"band c={c}: {summary}")
        return band

    async def _tracked(self, request: StreamRequest, delay_s: float = 0.0) -> StreamResult:
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        result = await fire(request)
        self.progress.request_done()
        return result


def _unreachable(served_model: str | None, why: str) -> RunRecord:
    reference = ReferenceJudgement(False, None, None, f"server unreachable: {why}")
    return RunRecord(None, served_model, reference, [], "UNMEASURABLE", unreachable=why)


def _reference_line(reference: ReferenceJudgement, num_prompts: int) -> str:
    state = "stable" if reference.is_stable else "NOT STABLE"
    why = f" ({reference.reason})" if reference.reason else ""
    label = "m=1 reference" if num_prompts == 1 else f"m=1 references ({num_prompts} prompts)"
    return f"{label}: {state}, self_divergence_at={reference.self_divergence_at}{why}"


def _sources_line(config: ProbeConfig, watcher: MFormedWatcher, info: Any) -> str:
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
    return f"{config.url}: {has_info} /v1/server_info; m_formed from {m_from}"


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
