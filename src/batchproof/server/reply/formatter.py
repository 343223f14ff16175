"""What an endpoint's formatter is (one per endpoint, in its package; serving.py drives it), and
the Chat Completions family's stream framing, which chat's and legacy completions' share."""

from typing import Protocol

from batchproof.common.wire import SSE_DONE, sse
from batchproof.engine.outputs import RequestOutput
from batchproof.server.errors import APIError

Delta = tuple[int, RequestOutput]  # (choice index, that choice's delta)


class ReplyFormatter(Protocol):
    """How one endpoint shapes one request's deltas; the runner drives it for both the
    streamed and the whole reply, so the two cannot drift apart."""

    wants_records: bool  # the request asked for logprobs: their count is checked against the tokens
    wants_token_ids: bool  # the request asked for token ids (vLLM's return_token_ids): checked the same way
    stream_end: bytes  # what a stream that completed ends with (chat's `data: [DONE]`)

    def encode(self, event: dict) -> bytes:
        """One stream event on the wire."""

    def first_chunks(self) -> list[dict]:
        """What a stream opens with, before any delta."""

    def chunks(self, index: int, out: RequestOutput) -> list[dict]:
        """One delta of choice `index` as stream events (it carries text or the finish); none
        when there is nothing to send yet."""

    def last_chunks(self, lasts: list[RequestOutput]) -> list[dict]:
        """What a stream that completed sends last (from each choice's last delta): usage when asked."""

    def error_chunks(self, error: APIError) -> list[dict]:
        """What a stream that failed midway sends before it ends (without `stream_end`)."""

    def whole(self, outputs: list[list[RequestOutput]]) -> dict:
        """Every delta of every choice (in index order) as one reply; raises APIError when the
        logprobs do not number the tokens."""


class ChunkStream:
    """The Chat Completions family's framing: bare `data:` events, an error as its envelope, `[DONE]` last."""

    stream_end = SSE_DONE
    wants_token_ids = False

    def encode(self, event: dict) -> bytes:
        return sse(event)

    def error_chunks(self, error: APIError) -> list[dict]:
        return [error.body()]
