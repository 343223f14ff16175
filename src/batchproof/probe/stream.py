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
from batchproof.probe.entry import Entry, EntryError, parse_entry, parse_legacy
from batchproof.probe.liveness import StreamMode, is_timed, observe, stream_mode
from batchproof.probe.verdict import decode_rate


class StreamError(Exception):
    """The stream cannot be read further; the request is an error."""


@dataclass
class StreamResult:
    """What one streamed request brought back, accumulated chunk by chunk."""

    entries: list[Entry] = field(default_factory=list)
    text: str = ""
    arrivals: list[float] = field(default_factory=list)
    ended_s: float | None = None  # when the stream ended, seconds after the POST
    completion_tokens: int | None = None
    finish_reason: str | None = None
    stream_mode: str | None = None
    has_usage: bool = False
    error: str | None = None
    is_unreachable: bool = False
    replica: str | None = None  # the x-batchproof-replica header: who served it (None: not said)
    status: int | None = None  # the HTTP status (None: no answer)
    refusal_body: str = ""  # a non-2xx answer's body, whole: which field a server refuses is in it
    cached_tokens: int | None = None  # prompt tokens served from the server's cache (None: not said)
    is_streamed: bool = True
    is_fail_open: bool = False  # a 200 with content but none of the logprobs asked for
    is_early_stop_ok: bool = False  # the request did not ask for ignore_eos: it may end early
    wants_logprobs: bool = True  # the request asked for them: a reply without any is a fail-open

    @property
    def mode(self) -> tuple[StreamMode, str | None]:
        """`declared`, `observed` or `buffered`, and a declaration the arrivals contradict."""
        return stream_mode(self.stream_mode, observe(self.arrivals, self.ended_s))

    @property
    def decode_tok_s(self) -> float | None:
        return decode_rate(is_timed(self.mode[0]), self.arrivals, self.completion_tokens)

    def logprob_vectors(self) -> list[tuple[float | None, ...]]:
        """Per token: its logprob, then its alternatives', as logprob parity compares them."""
        return [entry.logprob_vector for entry in self.entries]

    def feed(self, chunk: Any, arrival: float) -> None:
        """Take one parsed `data:` chunk that arrived `arrival` seconds after the POST."""
        if not isinstance(chunk, dict):
            raise StreamError(f"chunk is not an object: {chunk!r:.80}")
        if chunk.get("error") is not None:
            raise StreamError(f"error event: {_message(chunk)}")
        if isinstance(chunk.get("type"), str) and chunk["type"].startswith("response."):
            self._feed_response_event(chunk, arrival)
            return
        if self.stream_mode is None and isinstance(chunk.get("stream_mode"), str):
            self.stream_mode = chunk["stream_mode"]
        if isinstance(chunk.get("usage"), dict):
            self.has_usage = True
            tokens = chunk["usage"].get("completion_tokens")
            self.completion_tokens = tokens if _is_count(tokens) else None
        # llama.cpp says it in `timings`, which may ride on a chunk without usage.
        cached = cached_tokens(chunk)
        if cached is not None:
            self.cached_tokens = cached
        choices = chunk.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            self._feed_choice(choices[0], arrival)

    def _feed_choice(self, choice: dict[str, Any], arrival: float) -> None:
        # Chat streams carry text in `delta.content`; legacy completions in `text`.
        delta = choice.get("delta")
        content = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if isinstance(content, str) and content:
            self.arrivals.append(arrival)
            self.text += content
        if choice.get("finish_reason") is not None:
            self.finish_reason = str(choice["finish_reason"])
        # Entries may ride on any chunk (a held partial character goes out later).
        logprobs = choice.get("logprobs")
        if not isinstance(logprobs, dict):
            return
        try:
            if isinstance(logprobs.get("content"), list):  # chat's, and llama.cpp's on both routes
                self.entries.extend(parse_entry(raw) for raw in logprobs["content"])
            elif "tokens" in logprobs:
                self.entries.extend(parse_legacy(logprobs))
        except EntryError as err:
            raise StreamError(f"logprob entry {len(self.entries)}: {err}") from None

    def _feed_response_event(self, event: dict[str, Any], arrival: float) -> None:
        """The Responses API's semantic events: text and its entries in `output_text.delta`, usage
        and how it ended in the last event (`completed`, or `incomplete` when cut by the length)."""
        kind = event["type"]
        if kind == "response.created" and self.stream_mode is None and isinstance(event.get("stream_mode"), str):
            self.stream_mode = event["stream_mode"]
        elif kind == "response.output_text.delta":
            self._feed_choice({"text": event.get("delta"), "logprobs": {"content": event.get("logprobs") or []}},
                              arrival)
        elif kind == "response.failed":
            raise StreamError(f"response.failed: {_message(event.get('response') or {})}")
        elif kind in ("response.completed", "response.incomplete"):
            response = event.get("response")
            if isinstance(response, dict):
                self._feed_response_end(response)

    def _feed_response_end(self, response: dict[str, Any]) -> None:
        self.finish_reason = "length" if response.get("status") == "incomplete" else "stop"
        usage = response.get("usage")
        if isinstance(usage, dict):
            self.has_usage = True
            tokens = usage.get("output_tokens")
            self.completion_tokens = tokens if _is_count(tokens) else None
        cached = cached_tokens(response)
        if cached is not None:
            self.cached_tokens = cached

    def finish(self) -> None:
        """The reply ended: one without usage or without content is an error, and one with
        content but no logprob entry at all is a fail-open (asked for logprobs, got a 200 without)."""
        if self.error is not None:
            return
        how = "stream" if self.is_streamed else "reply"
        if not self.has_usage:
            self.error = f"the {how} carried no usage"
        elif not self.text:
            self.error = f"the {how} carried no content"
        elif not self.entries and self.wants_logprobs:
            self.is_fail_open = True
            how = "streamed" if self.is_streamed else "not streamed"
            self.error = f"fail-open: HTTP 200 with content but no logprobs ({how})"


def asks_logprobs(body: dict[str, Any]) -> bool:
    """Whether a request asks for logprobs: chat's `logprobs: true`, the legacy route's count, or
    the Responses API's include. A reply to one that does not (a speed bench's plain request)
    carries none, and that is no fail-open."""
    logprobs = body.get("logprobs")
    return logprobs is True or _is_count(logprobs) or "message.output_text.logprobs" in (body.get("include") or [])


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def cached_tokens(doc: dict[str, Any]) -> int | None:
    """Prompt tokens the server says it served from its cache: OpenAI's
    `usage.prompt_tokens_details.cached_tokens`, or llama.cpp's `timings.cache_n`."""
    usage = doc.get("usage")
    # chat and completions: prompt_tokens_details; responses: input_tokens_details
    details = usage.get("prompt_tokens_details", usage.get("input_tokens_details")) if isinstance(usage, dict) else None
    if isinstance(details, dict) and _is_count(details.get("cached_tokens")):
        return details["cached_tokens"]
    timings = doc.get("timings")
    if isinstance(timings, dict) and _is_count(timings.get("cache_n")):
        return timings["cache_n"]
    return None


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
        raise StreamError(f"error event: {_message(chunk)}")
    return chunk


def _message(doc: Any) -> str:
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    return str(error if error is not None else doc)[:200]


def _body_message(body: str) -> str:
    try:
        return _message(json.loads(body))
    except json.JSONDecodeError:
        return body.strip()[:200] or "(empty body)"
