"""One streamed reply as the probe records it: a StreamResult, filled chunk by chunk from a
server's SSE events (or from one whole reply), read by the wire and judged by the judges."""

from dataclasses import dataclass, field
from typing import Any

from batchproof.probe.records.entry import Entry, EntryError, parse_entry, parse_legacy
from batchproof.probe.records.liveness import StreamMode, decode_rate, is_timed, observe, stream_mode


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
            raise StreamError(f"error event: {error_message(chunk)}")
        if isinstance(chunk.get("type"), str) and chunk["type"].startswith("response."):
            self._feed_response_event(chunk, arrival)
            return
        if self.stream_mode is None and isinstance(chunk.get("stream_mode"), str):
            self.stream_mode = chunk["stream_mode"]
        if isinstance(chunk.get("usage"), dict):
            self.has_usage = True
            tokens = chunk["usage"].get("completion_tokens")
            self.completion_tokens = tokens if is_count(tokens) else None
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
            raise StreamError(f"response.failed: {error_message(event.get('response') or {})}")
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
            self.completion_tokens = tokens if is_count(tokens) else None
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


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def cached_tokens(doc: dict[str, Any]) -> int | None:
    """Prompt tokens the server says it served from its cache: OpenAI's
    `usage.prompt_tokens_details.cached_tokens`, or llama.cpp's `timings.cache_n`."""
    usage = doc.get("usage")
    # chat and completions: prompt_tokens_details; responses: input_tokens_details
    details = usage.get("prompt_tokens_details", usage.get("input_tokens_details")) if isinstance(usage, dict) else None
    if isinstance(details, dict) and is_count(details.get("cached_tokens")):
        return details["cached_tokens"]
    timings = doc.get("timings")
    if isinstance(timings, dict) and is_count(timings.get("cache_n")):
        return timings["cache_n"]
    return None


def error_message(doc: Any) -> str:
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    return str(error if error is not None else doc)[:200]
