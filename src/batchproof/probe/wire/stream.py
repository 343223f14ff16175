"""Fire one streamed request (chat, legacy completions or responses) and read its SSE chunks into a StreamResult."""

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from batchproof.common.wire import DONE, REPLICA_HEADER, SSEReader
from batchproof.probe.records.reply import StreamError, StreamResult, error_message, is_count


def asks_logprobs(body: dict[str, Any]) -> bool:
    """Whether a request asks for logprobs: chat's `logprobs: true`, the legacy route's count, or
    the Responses API's include. A reply to one that does not (a speed bench's plain request)
    carries none, and that is no fail-open."""
    logprobs = body.get("logprobs")
    return logprobs is True or is_count(logprobs) or "message.output_text.logprobs" in (body.get("include") or [])


@dataclass(frozen=True)
class StreamRequest:
    url: str
    body: dict[str, Any]
    headers: dict[str, str]
    timeout_s: float
    # Shared by every stream: building a context costs ~30 ms, which would stagger a band.
    ssl_context: ssl.SSLContext = field(default_factory=httpx.create_ssl_context)


async def fire(request: StreamRequest, is_streamed: bool = True) -> StreamResult:
    """POST one request on its own connection and read it to the end: streamed as asked, or
    (`is_streamed` False, for stream parity) the same request as one whole reply."""
    result = StreamResult(is_streamed=is_streamed, is_early_stop_ok=request.body.get("ignore_eos") is not True,
                          wants_logprobs=asks_logprobs(request.body))
    body = request.body if is_streamed else unstreamed_body(request.body)
    timeout = httpx.Timeout(request.timeout_s, connect=min(10.0, request.timeout_s))
    # A client per request: llama.cpp's server closes a streamed connection after each
    # reply, and c concurrent streams must not queue behind a shared pool.
    try:
        async with asyncio.timeout(request.timeout_s):
            async with httpx.AsyncClient(
                timeout=timeout, headers=request.headers, verify=request.ssl_context
            ) as client:
                start = time.perf_counter()
                async with client.stream("POST", request.url, json=body) as response:
                    result.replica = replica_of(response.headers)
                    result.status = response.status_code
                    if not response.is_success:
                        refused(result, (await response.aread()).decode("utf-8", "replace"))
                        return result
                    if is_streamed:
                        async for chunk in _sse_chunks(response):
                            result.feed(chunk, time.perf_counter() - start)
                    else:
                        read_whole(_decode((await response.aread()).decode("utf-8", "replace"), ""), result)
                    result.ended_s = time.perf_counter() - start
    except (httpx.ConnectError, httpx.ConnectTimeout) as err:
        result.error = f"cannot connect: {str(err) or type(err).__name__}"
        result.is_unreachable = True
    except StreamError as err:
        result.error = str(err)
    except TimeoutError:
        result.error = f"no complete reply within {request.timeout_s:g}s"
    except httpx.HTTPError as err:
        result.error = f"{type(err).__name__}: {err}"
    except Exception as err:  # any server's oddity is this request's error, not a crash
        result.error = f"unexpected {type(err).__name__}: {err}"
    result.finish()
    return result


def unstreamed_body(body: dict[str, Any]) -> dict[str, Any]:
    """The same request asked for whole: `stream` false, and no stream_options (which some
    servers refuse without a stream)."""
    return {key: value for key, value in body.items() if key != "stream_options"} | {"stream": False}


def read_whole(doc: Any, result: StreamResult) -> None:
    """A whole reply read as one chunk: chat's `message` is a stream's `delta`, usage and
    legacy `text` sit where a stream's last chunks carry them; a `response` object's message
    text parts are read as one delta each, then its end."""
    if isinstance(doc, dict) and doc.get("object") == "response" and isinstance(doc.get("output"), list):
        for item in doc["output"]:
            for part in (item.get("content") or []) if isinstance(item, dict) and item.get("type") == "message" else []:
                if isinstance(part, dict) and part.get("type") == "output_text":
                    result.feed({"type": "response.output_text.delta", "delta": part.get("text"),
                                 "logprobs": part.get("logprobs")}, 0.0)
        result._feed_response_end(doc)
        return
    if isinstance(doc, dict) and isinstance(doc.get("choices"), list):
        choices = [{**c, "delta": c.get("message")} if isinstance(c, dict) and "message" in c else c
                   for c in doc["choices"]]
        doc = {**doc, "choices": choices}
    result.feed(doc, 0.0)


def refused(result: StreamResult, body: str) -> None:
    """A non-2xx answer: the request's error, and its body kept for the field negotiation."""
    result.refusal_body = body[:4000]
    result.error = f"HTTP {result.status}: {_body_message(body)}"


def replica_of(headers: httpx.Headers) -> str | None:
    """The replica a reply names, or None when it names none (servers other than ours)."""
    value = headers.get(REPLICA_HEADER, "").strip()
    return value or None


async def _sse_chunks(response: httpx.Response) -> AsyncIterator[Any]:
    """Each event's JSON payload, until `[DONE]` or the end of the body."""
    reader = SSEReader()
    async for line in response.aiter_lines():
        event = reader.feed(line)
        if event is not None:
            if event[1].strip() == DONE:
                return
            yield _decode(event[1], event[0])
    event = reader.finish()
    if event is not None and event[1].strip() != DONE:
        yield _decode(event[1], event[0])


def _decode(payload: str, event: str) -> Any:
    try:
        chunk = json.loads(payload)
    except json.JSONDecodeError:
        raise StreamError(f"chunk is not JSON: {payload!r:.80}") from None
    if event == "error":
        raise StreamError(f"error event: {error_message(chunk)}")
    return chunk


def _body_message(body: str) -> str:
    try:
        return error_message(json.loads(body))
    except json.JSONDecodeError:
        return body.strip()[:200] or "(empty body)"
