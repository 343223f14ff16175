"""The run: m=1 references (one per prompt, twice each; on a fleet, until each replica has
answered twice), then each band of c concurrent requests, then on a fleet the replicas' agreement."""

import asyncio
import dataclasses
import time
from collections import Counter
from typing import Any

import httpx

from batchproof.probe.config import ProbeConfig
from batchproof.probe.display import ProgressDisplay, served_by
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
from batchproof.probe.references import (
    alone_groups,
    as_reference,
    fleet_replies,
    group_record,
    judge_runs,
    judged_reference,
    reference_for,
    sample,
)
from batchproof.probe.request import ROUTES, request_body
from batchproof.probe.stream import StreamRequest, StreamResult, fire
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
            requests = [
                StreamRequest(
                    url=f"{config.url}{ROUTES[config.route]}",
                    body=request_body(config.route, prompt, self.matrix, served_model),
                    headers=headers(config),
                    timeout_s=config.timeout_s,
                )
                for prompt in self.prompts
            ]
            record = await self._measure(watcher, requests, listed)
            return dataclasses.replace(record, server_info=info, served_model=served_model)

    async def _measure(
        self, watcher: MFormedWatcher, requests: list[StreamRequest], listed: list[Listed] | None
    ) -> RunRecord:
        alone = await self._references(watcher, requests, listed)
        if alone[-1][-1].is_unreachable:
            return _unreachable(None, alone[-1][-1].error or "")
        is_fleet, n_predict = self.config.is_fleet, self.matrix.n_predict
        groups = alone_groups(alone, is_fleet)
        judged = [(g, judge_runs([sample(run) for run in g.runs], self.policy)) for g in groups]
        reference = judged_reference(judged, len(alone), is_fleet)
        records = [group_record(g, j) for g, j in judged]
        self.progress.phase_done(_reference_line(reference, len(alone), alone if is_fleet else None))
        # A fleet whose replies name no replica cannot be measured as one: stop before the bands.
        is_nameless = is_fleet and all(run.replica is None for runs in alone for run in runs)
        bands: list[dict[str, Any]] = []
        if reference.is_stable and not is_nameless:
            for c in self.matrix.ladder:
                bands.append(await self._band(c, watcher, requests, alone))
        verdict = run_verdict(reference.is_stable, [(b["c"], b["result"]) for b in bands])
        fleet = None
        if is_fleet:
            slot_replicas = [s["replica"] for b in bands for s in b["slots"]]
            judgement = judge_fleet(fleet_replies(alone, n_predict), slot_replicas, listed)
            verdict = with_fleet(verdict, judgement.result)
            fleet = fleet_record(judgement)
        return RunRecord(None, None, reference, bands, verdict, references=records, fleet=fleet)

    async def _references(
        self, watcher: MFormedWatcher, requests: list[StreamRequest], listed: list[Listed] | None
    ) -> list[list[StreamResult]]:
        """Each prompt's m=1 runs, in the order they came back: two, or on a fleet until every
        replica seen (and listed alive) has answered twice (at most alone_cap)."""
        # One at a time, each waiting for its batch record, so none leaks into a band.
        is_fleet = self.config.is_fleet
        per_prompt = alone_cap(listed) if is_fleet else 2
        self.progress.phase(_references_label(len(requests), is_fleet), per_prompt * len(requests))
        alone: list[list[StreamResult]] = []
        for request in requests:
            runs: list[StreamResult] = []
            alone.append(runs)
            while True:
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
        self, c: int, watcher: MFormedWatcher, requests: list[StreamRequest], alone: list[list[StreamResult]]
    ) -> dict[str, Any]:
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
        band = band_record(c, m_formed, source, judgement, slots, self.matrix, worst, by_replica)
        took = time.perf_counter() - start
        on = f", on {served_by(band)}" if config.is_fleet else ""
        summary = f"{len(results)}/{c} back in {took:.1f}s, m_formed={m_formed}{on}, {band['result']}"
        self.progress.phase_done(f"band c={c}: {summary}")
        return band

    async def _tracked(self, request: StreamRequest, delay_s: float = 0.0) -> StreamResult:
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        result = await fire(request)
        self.progress.request_done()
        return result


def _named(result: StreamResult) -> list[str]:
    return [] if result.replica is None else [result.replica]


def _all_named(results: list[StreamResult]) -> list[str]:
    return [r.replica for r in results if r.replica is not None]


def _unreachable(served_model: str | None, why: str) -> RunRecord:
    reference = ReferenceJudgement(False, None, None, f"server unreachable: {why}")
    return RunRecord(None, served_model, reference, [], "UNMEASURABLE", unreachable=why)


def _references_label(num_prompts: int, is_fleet: bool = False) -> str:
    label = "m=1 reference" if num_prompts == 1 else f"m=1 references ({num_prompts} prompts)"
    return f"{label}, each replica twice (at most)" if is_fleet else label


def _reference_line(reference: ReferenceJudgement, num_prompts: int, alone: list[list[StreamResult]] | None) -> str:
    state = "stable" if reference.is_stable else "NOT STABLE"
    why = f" ({reference.reason})" if reference.reason else ""
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
