"""Turning generated tokens into released text, cutting at stop strings, and releasing
each token's id and record with the text that carries it."""

from dataclasses import dataclass, field

from batchproof.engine.sampling.logprobs import TokenRecord
from batchproof.engine.text.tokenizer import Tokenizer, incremental_utf8_decoder


@dataclass
class TextDelta:
    text: str = ""
    records: list[TokenRecord] = field(default_factory=list)
    # Every released token's id (records exist only when logprobs were asked for): a rollout's
    # tokens as generated, so a trainer never re-tokenizes the text.
    token_ids: list[int] = field(default_factory=list)


@dataclass
class _Token:
    token_id: int
    char_start: int  # characters of text before this token's first byte
    release_at: int  # released once this many characters are out
    record: TokenRecord | None


class TextStream:
    """One request's reply text, released as it becomes final.

    Text is held while it ends in an incomplete UTF-8 character or could be the start
    of a stop string; a token's id and record go out with the chunk that carries the end
    of its text, never before, and never after a later token's.
    """

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...]) -> None:
        self._tokenizer = tokenizer
        self._stop = stop
        self._decoder = incremental_utf8_decoder()
        self.text = ""
        self._released_chars = 0
        self._tokens: list[_Token] = []
        self._released_tokens = 0
        self.is_stopped = False
        self.num_kept_tokens = 0  # tokens whose bytes reach the returned text

    def add(self, token_id: int, record: TokenRecord | None) -> TextDelta:
        assert not self.is_stopped
        start = len(self.text)
        self.text += self._decoder.decode(self._tokenizer.decode_bytes(token_id))
        # A token that completed no character contributes to the one being built at `start`.
        self._tokens.append(_Token(token_id, start, max(len(self.text), start + 1), record))
        cut = self._find_stop()
        if cut is not None:
            return self._stop_at(cut)
        return self._release(len(self.text) - self._held_suffix())

    def finish(self) -> TextDelta:
        """Everything still held: the flushed decoder tail and every remaining id and record."""
        if not self.is_stopped:
            self.text += self._decoder.decode(b"", final=True)
        return self._release(len(self.text), every_token=True)

    def _find_stop(self) -> int | None:
        found = [i for s in self._stop if (i := self.text.find(s, self._released_chars)) >= 0]
        return min(found) if found else None

    def _stop_at(self, cut: int) -> TextDelta:
        self.is_stopped = True
        self.text = self.text[:cut]
        # Tokens wholly after the cut did not make the reply; a straddling one did.
        self._tokens = [t for t in self._tokens if t.char_start < cut]
        return self.finish()

    def _held_suffix(self) -> int:
        """Length of the longest tail of text that could still grow into a stop string."""
        unreleased = len(self.text) - self._released_chars
        for n in range(min(max((len(s) for s in self._stop), default=1) - 1, unreleased), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self._stop):
                return n
        return 0

    def _release(self, upto: int, every_token: bool = False) -> TextDelta:
        delta = TextDelta()
        if upto > self._released_chars:
            delta.text = self.text[self._released_chars:upto]
            self._released_chars = upto
        while self._released_tokens < len(self._tokens):
            token = self._tokens[self._released_tokens]
            if not every_token and (token.release_at > upto or not delta.text):
                break  # ids and records ride only on chunks that carry text, in token order
            delta.token_ids.append(token.token_id)
            if token.record is not None:
                delta.records.append(token.record)
            self._released_tokens += 1
        self.num_kept_tokens = len(self._tokens)
        return delta
