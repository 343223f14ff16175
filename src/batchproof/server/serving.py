"""Running one planned request: admission, deadline, disconnects, and failing closed."""

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from batchproof.common.wire import REPLICA_HEADER
from batchproof.engine.async_engine import ABORTED_BY_REQUEST, Opened
from batchproof.engine.outputs import RequestOutput
from batchproof.server.engine_client import Backend
from batchproof.server.errors import APIError, count_mismatch
from batchproof.server.metrics import Metrics
from batchproof.server.reply.entries import ids_mismatch
from batchproof.server.reply.formatter import Delta, ReplyFormatter
from batchproof.server.reply.json_body import json_reply
from batchproof.server.reply.merge import merge
from batchproof.server.request.plan import Plan
from batchproof.server.state import ServerState

QUEUE_RETRY_AFTER_S = 1


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def admit(engine: Backend, max_queue: int, num_sequences: int = 1) -> None:
    if engine.failure is not None:
        raise APIError(503, f"the engine stopped ({type(engine.failure).__name__}: {engine.failure}); "
                            "restart the server", type_="service_unavailable")
    if engine.num_waiting + num_sequences > max_queue:
        raise APIError(429, f"the queue is full ({engine.num_waiting} sequences waiting, {num_sequences} more "
                            f"asked, max_queue={max_queue}); "
                            "retry later", type_="rate_limit_error", headers={"Retry-After": str(QUEUE_RETRY_AFTER_S)})


# Errors of the request's own grammar (with its min_tokens, or past llguidance's limits on a
# mask's work): a 400 naming why, as a grammar refused before it ran would be.
REQUEST_GRAMMAR_ERRORS = frozenset({"grammar_exhausted", "grammar_failed"})


def engine_error(out: RequestOutput, timeout_s: float) -> APIError | None:
    if out.finish_reason == "error" and out.error_code in REQUEST_GRAMMAR_ERRORS:  # the request's own doing
        return APIError(400, f"generation stopped: {out.error}", code=out.error_code)
    if out.finish_reason == "error" and out.error_code == "grammar_timeout":  # the grammar workers are behind
        return APIError(503, f"generation stopped: {out.error}; retry later", type_="service_unavailable",
                        code="grammar_timeout", headers={"Retry-After": str(QUEUE_RETRY_AFTER_S)})
    if out.finish_reason == "error":
        return APIError(500, f"generation failed: {out.error}", type_="server_error")
    if out.finish_reason == "unavailable":  # the replica running it went away (a fleet)
        return APIError(503, f"generation failed: {out.error}", type_="service_unavailable")
    if out.finish_reason == "abort" and out.error_code != ABORTED_BY_REQUEST:  # (/abort_requests: a reply)
        return APIError(504, f"request aborted after {timeout_s:g} s", type_="timeout_error")
    return None


def timeout_error(timeout_s: float) -> APIError:
    return APIError(504, f"request timed out after {timeout_s:g} s", type_="timeout_error")


async def deltas(opened: Opened, metrics: Metrics, num_prompt_tokens: int, arrival: float,
                 timeout_s: float) -> AsyncIterator[RequestOutput]:
    """One sequence's deltas, ending with its final one; TimeoutError past the deadline."""
    last_token_time: float | None = None
    num_tokens = 0
    metrics.prompt_tokens.inc(num_prompt_tokens)
    async with contextlib.aclosing(opened.outputs) as stream:
        async with asyncio.timeout(timeout_s):
            async for out in stream:
                if out.num_output_tokens > num_tokens:
                    now = time.perf_counter()
                    if last_token_time is None:
                        metrics.ttft.observe(now - arrival)
                    else:
                        metrics.token_latency.observe((now - last_token_time) / (out.num_output_tokens - num_tokens))
                    metrics.completion_tokens.inc(out.num_output_tokens - num_tokens)
                    last_token_time, num_tokens = now, out.num_output_tokens
                yield out


CLIENT_GONE = 499  # nginx's "client closed request": logged and counted, never sent


@dataclass
class Submitted:
    request_id: str
    replicas: list[str]  # who runs each choice, in choice order
    stream: AsyncIterator[Delta]

    @property
    def headers(self) -> dict[str, str]:
        return {REPLICA_HEADER: ",".join(dict.fromkeys(self.replicas))}


async def submit(state: ServerState, plan: Plan, id_prefix: str, owner: str | None) -> Submitted:
    """Admit a planned request (or refuse it: 429, 503) -> its id, who runs it and the deltas of
    all its choices. Each choice is opened before the reply starts, so a fleet names its
    replicas in the headers and an unreachable one is a 503, not a broken stream."""
    backend = state.backend
    admit(backend, state.config.max_queue, len(plan.choices))
    request_id = new_request_id(id_prefix)
    arrival = time.perf_counter()
    opened: dict[int, Opened] = {}
    try:
        for choice in plan.choices:
            opened[choice.index] = await backend.open(f"{request_id}-{choice.index}", plan.prompt_ids(choice),
                                                      choice.params)
    except BaseException:
        for one in opened.values():
            await one.outputs.aclose()
        raise
    streams = {choice.index: deltas(opened[choice.index], state.metrics, len(plan.prompt_ids(choice)), arrival,
                                    state.config.request_timeout_s) for choice in plan.choices}
    stream = state.owners.hold(request_id, owner, merge(streams))  # a tenant may abort its own
    return Submitted(request_id, [one.replica for one in opened.values()], stream)


async def collect(request: Request, stream: AsyncIterator[Delta]) -> list[Delta] | None:
    """Every delta of an unstreamed request; None if the client hung up (which aborts it)."""

    async def gather() -> list[Delta]:
        async with contextlib.aclosing(stream):
            return [out async for out in stream]

    async def hang_up() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    work, watch = asyncio.create_task(gather()), asyncio.create_task(hang_up())
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work, watch):
            task.cancel()
        await asyncio.gather(work, watch, return_exceptions=True)
    if work not in done:
        return None
    return work.result()


async def reply(request: Request, submitted: Submitted, timeout_s: float, is_streamed: bool,
                formatter: ReplyFormatter) -> Response:
    """The response for one request: an SSE stream of its chunks, or the whole reply."""
    stream = submitted.stream
    if is_streamed:
        return StreamingResponse(sse_events(stream, timeout_s, formatter), media_type="text/event-stream",
                                 headers=submitted.headers)
    by_choice = await collect_choices(request, stream, timeout_s)
    if by_choice is None:
        return Response(status_code=CLIENT_GONE)
    # Built and encoded off the event loop: a reply at the entries' limit is megabytes.
    return await json_reply(lambda: formatter.whole([by_choice[i] for i in sorted(by_choice)]),
                            headers=submitted.headers)


async def collect_choices(request: Request, stream: AsyncIterator[Delta],
                          timeout_s: float) -> dict[int, list[RequestOutput]] | None:
    """An unstreamed request's deltas by choice index; None if the client hung up. A timeout, or a
    choice that ended in an engine error, raises its APIError."""
    try:
        deltas = await collect(request, stream)
    except TimeoutError:
        raise timeout_error(timeout_s) from None
    if deltas is None:
        return None
    by_choice: dict[int, list[RequestOutput]] = {}
    for index, out in deltas:
        by_choice.setdefault(index, []).append(out)
    for outputs in by_choice.values():
        error = engine_error(outputs[-1], timeout_s)
        if error is not None:
            raise error
    return by_choice


def _miscounted(counts: dict[int, int], index: int, num: int, out: RequestOutput,
                mismatch: Callable[[int, int], APIError]) -> APIError | None:
    """Add a delta's entries (or ids) to its choice's count; at the choice's end, the error when
    they do not number its tokens."""
    counts[index] = counts.get(index, 0) + num
    if out.finish_reason is not None and counts[index] != out.num_kept_tokens:
        return mismatch(counts[index], out.num_kept_tokens)
    return None


async def sse_events(stream: AsyncIterator[Delta], timeout_s: float,
                     formatter: ReplyFormatter) -> AsyncIterator[bytes]:
    """The first chunks, then the chunks of each delta that carries text or the finish, then
    the last chunks (usage) and the stream's end; an error, a timeout or a choice whose records
    (or token ids) do not number its tokens ends the stream with the formatter's error chunks instead."""
    for event in formatter.first_chunks():
        yield formatter.encode(event)
    num_records: dict[int, int] = {}
    num_ids: dict[int, int] = {}
    lasts: dict[int, RequestOutput] = {}
    try:
        async with contextlib.aclosing(stream):
            async for index, out in stream:
                error = engine_error(out, timeout_s)
                if error is None and formatter.wants_records:
                    error = _miscounted(num_records, index, len(out.records), out, count_mismatch)
                if error is None and formatter.wants_token_ids:
                    error = _miscounted(num_ids, index, len(out.token_ids), out, ids_mismatch)
                if error is not None:
                    for event in formatter.error_chunks(error):
                        yield formatter.encode(event)
                    return
                if out.text or out.finish_reason is not None:
                    # none while text is held back (it may be a tool call)
                    for event in formatter.chunks(index, out):
                        yield formatter.encode(event)
                lasts[index] = out
    except TimeoutError:
        for event in formatter.error_chunks(timeout_error(timeout_s)):
            yield formatter.encode(event)
        return
    for event in formatter.last_chunks([lasts[i] for i in sorted(lasts)]):
        yield formatter.encode(event)
    yield formatter.stream_end
