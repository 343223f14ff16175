"""The run: two m=1 references, then each band of c concurrent identical requests."""

import asyncio
import dataclasses
import time
from typing import Any

import httpx

from batchproof.probe.config import ProbeConfig
from batchproof.probe.display import ProgressDisplay
from batchproof.probe.m_formed import MFormedWatcher
from batchproof.probe.matrix import Matrix
from batchproof.probe.stream import StreamRequest, StreamResult, fire
from batchproof.probe.verdict import (
    Policy,
    ReferenceJudgement,
    Sample,
    judge_band,
    judge_reference,
    refusal,
    run_verdict,
)
from batchproof.probe.witness import TOP_LOGPROBS, RunRecord, SlotRecord, band_record


def request_body(config: ProbeConfig, matrix: Matrix, served_model: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {} if served_model is None else {"model": served_model}
    return body | {
        "messages": [{"role": "user", "content": config.prompt}],
        "temperature": matrix.temperature,
        "max_tokens": matrix.n_predict,
        "seed": matrix.seed,
        "ignore_eos": matrix.ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": True,
        "top_logprobs": TOP_LOGPROBS,
    }


def headers(config: ProbeConfig) -> dict[str, str]:
    return {} if config.api_key is None else {"Authorization": f"Bearer {config.api_key}"}


def sample(result: StreamResult) -> Sample:
    identities = [entry.identity for entry in result.entries]
    return Sample(identities, result.completion_tokens, result.error)


def slot_record(result: StreamResult, n_predict: int) -> SlotRecord:
    refused = refusal(sample(result), n_predict)
    return SlotRecord(result.completion_tokens, result.finish_reason, refused, result.decode_tok_s)


class Prober:
    """One run against one server; holds what every band shares."""

    def __init__(self, config: ProbeConfig, matrix: Matrix, progress: ProgressDisplay) -> None:
        self.config = config
        self.matrix = matrix
        self.progress = progress
        self.policy = Policy(matrix.n_predict, matrix.min_agree_tokens, matrix.max_constant_run)

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
            request = StreamRequest(
                url=f"{config.url}/v1/chat/completions",
                body=request_body(config, self.matrix, served_model),
                headers=headers(config),
                timeout_s=config.timeout_s,
            )
            record = await self._measure(watcher, request)
            return dataclasses.replace(record, server_info=info, served_model=served_model)

    async def _measure(self, watcher: MFormedWatcher, request: StreamRequest) -> RunRecord:
        refs = await self._references(watcher, request)
        if refs[0].is_unreachable:
            return _unreachable(None, refs[0].error or "")
        reference = judge_reference(sample(refs[0]), sample(refs[1]), self.policy)
        self.progress.phase_done(_reference_line(reference))
        bands: list[dict[str, Any]] = []
        if reference.is_stable:
            for c in self.matrix.ladder:
                bands.append(await self._band(c, watcher, request, refs[0]))
        verdict = run_verdict(reference.is_stable, [(b["c"], b["result"]) for b in bands])
        return RunRecord(None, None, reference, bands, verdict)

    async def _references(
        self, watcher: MFormedWatcher, request: StreamRequest
    ) -> list[StreamResult]:
        # One at a time, each waiting for its batch record, so none leaks into a band.
        self.progress.phase("m=1 reference", 2)
        first, _, _ = await watcher.measure(self._tracked(request))
        if first.is_unreachable:
            return [first, first]
        second, _, _ = await watcher.measure(self._tracked(request))
        return [first, second]

    async def _band(
        self, c: int, watcher: MFormedWatcher, request: StreamRequest, reference: StreamResult
    ) -> dict[str, Any]:
        self.progress.phase(f"band c={c}", c)
        start = time.perf_counter()
        work = asyncio.gather(*(self._tracked(request) for _ in range(c)))
        results, m_formed, source = await watcher.measure(work)
        judgement = judge_band(
            c,
            m_formed,
            [entry.identity for entry in reference.entries],
            [entry.top2_margin for entry in reference.entries],
            [sample(r) for r in results],
            self.policy,
        )
        slots = [slot_record(r, self.matrix.n_predict) for r in results]
        band = band_record(c, m_formed, source, judgement, slots, self.matrix)
        took = time.perf_counter() - start
        summary = f"{len(results)}/{c} back in {took:.1f}s, m_formed={m_formed}, {band['result']}"
        self.progress.phase_done(f"band c={c}: {summary}")
        return band

    async def _tracked(self, request: StreamRequest) -> StreamResult:
        result = await fire(request)
        self.progress.request_done()
        return result


def _unreachable(served_model: str | None, why: str) -> RunRecord:
    reference = ReferenceJudgement(False, None, None, f"server unreachable: {why}")
    return RunRecord(None, served_model, reference, [], "UNMEASURABLE", unreachable=why)


def _reference_line(reference: ReferenceJudgement) -> str:
    state = "stable" if reference.is_stable else "NOT STABLE"
    why = f" ({reference.reason})" if reference.reason else ""
    return f"m=1 reference: {state}, self_divergence_at={reference.self_divergence_at}{why}"


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
