"""Replies in OpenAI's shapes: one formatter object per endpoint, and the entries they share."""

from typing import Protocol

from batchproof.engine.sequence import RequestOutput

Delta = tuple[int, RequestOutput]  # (choice index, that choice's delta)


class ReplyFormatter(Protocol):
    """How one endpoint shapes one request's deltas; the runner drives it for both the
    streamed and the whole reply, so the two cannot drift apart."""

    wants_records: bool  # the request asked for logprobs: their count is checked against the tokens

    def first_chunks(self) -> list[dict]:
        """What a stream opens with, before any delta."""

    def chunk(self, index: int, out: RequestOutput) -> dict | None:
        """One delta of choice `index` as a stream chunk (it carries text or the finish), or None
        when there is nothing to send yet."""

    def usage_chunk(self, lasts: list[RequestOutput]) -> dict | None:
        """The stream's closing usage chunk (from each choice's last delta), or None when not asked for."""

    def whole(self, outputs: list[list[RequestOutput]]) -> dict:
        """Every delta of every choice (in index order) as one reply; raises APIError when the
        logprobs do not number the tokens."""
