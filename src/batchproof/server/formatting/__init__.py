"""Replies in OpenAI's shapes: one formatter object per endpoint, and the entries they share."""

from typing import Protocol

from batchproof.engine.sequence import RequestOutput


class ReplyFormatter(Protocol):
    """How one endpoint shapes one request's deltas; the runner drives it for both the
    streamed and the whole reply, so the two cannot drift apart."""

    wants_records: bool  # the request asked for logprobs: their count is checked against the tokens

    def first_chunks(self) -> list[dict]:
        """What a stream opens with, before any delta."""

    def chunk(self, out: RequestOutput) -> dict:
        """One delta as a stream chunk (it carries text or the finish)."""

    def usage_chunk(self, last: RequestOutput) -> dict | None:
        """The stream's closing usage chunk, or None when the client did not ask for it."""

    def whole(self, outputs: list[RequestOutput]) -> dict:
        """Every delta as one reply; raises APIError when the logprobs do not number the tokens."""
