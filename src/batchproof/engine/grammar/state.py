"""One constrained sequence's grammar: which tokens it allows next, and the token it took.

The next mask is computed on the grammar thread as soon as a token is consumed, while the
engine thread runs the next forward pass (our kernels release the GIL), so a step waits for
a mask only when the mask took longer than the forward pass. One thread: a sequence's matcher
is only ever touched by one thread at a time (the engine's waits for the grammar thread's job).
"""

from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch
from llguidance import LLMatcher

from batchproof.engine.grammar.compile import LIMITS
from batchproof.engine.grammar.tokenizer import grammar_tokenizer
from batchproof.engine.tokenizer import Tokenizer

_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batchproof-grammar")


class GrammarFailure(RuntimeError):
    """The matcher entered its error state (a limit, or a token it could not take)."""


def unpack_mask(bitmask: bytes, vocab_size: int) -> torch.Tensor:
    """llguidance's bitmask (bit i of little-endian word i // 32 is token i) -> bool [V].
    numpy's unpackbits, not torch's shifts: 0.04 ms at 262,144 tokens against 24 ms (torch's
    broadcast ops went through its thread pool, beside the forward pass's)."""
    bits = np.unpackbits(np.frombuffer(bitmask, dtype=np.uint8), bitorder="little")[:vocab_size]
    return torch.from_numpy(bits.view(np.bool_))


class GrammarState:
    def __init__(self, tokenizer: Tokenizer, grammar: str) -> None:
        self.vocab_size = tokenizer.vocab_size
        self.is_stopped = False  # the grammar is complete and takes no further token
        self._matcher: LLMatcher | None = None
        # Built on the grammar thread too: a big schema takes up to a second to compile.
        self._next: Future[torch.Tensor | str] = _worker.submit(self._start, tokenizer, grammar)

    def _start(self, tokenizer: Tokenizer, grammar: str) -> torch.Tensor | str:
        self._matcher = LLMatcher(grammar_tokenizer(tokenizer), grammar, log_level=0, limits=LIMITS)
        return self._mask()

    def _mask(self) -> torch.Tensor | str:
        matcher = self._matcher
        if matcher.is_error():
            return matcher.get_error()
        bitmask = matcher.compute_bitmask()
        if matcher.is_error():
            return matcher.get_error()
        return unpack_mask(bitmask, self.vocab_size)

    def allowed(self) -> torch.Tensor:
        """bool [V]: the tokens the grammar takes next (its end-of-turn ids once complete)."""
        result = self._next.result()
        if isinstance(result, str):
            raise GrammarFailure(f"the grammar failed: {result}")
        return result

    def advance(self, token_id: int) -> None:
        """Take the chosen token, then start on the next mask."""
        self._next.result()
        if not self._matcher.consume_token(token_id):
            raise GrammarFailure(f"the grammar refused token {token_id}: {self._matcher.get_error()}")
        self.is_stopped = self._matcher.is_stopped()
        if not self.is_stopped:
            self._next = _worker.submit(self._mask)
