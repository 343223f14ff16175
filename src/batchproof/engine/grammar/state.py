"""One constrained sequence's grammar: which tokens it allows next, and the token it took.

Its matcher (a copy of the grammar's compiled one, matchers.py) and each next mask are computed
on a grammar worker as soon as the sequence is admitted to run or has consumed a token, while
the engine thread runs the forward pass (our kernels release the GIL), so a step waits for a
mask only when the mask took longer than the forward pass (and never past the engine's
grammar_mask_timeout_s: outputs.py fails only the late rows). A sequence's jobs are chained (the next is
submitted only after the engine has taken the last one's result), so its matcher is only ever
touched by one thread at a time, whichever worker that is.
"""

from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from batchproof.engine.grammar.matchers import CompileError, compiled_matchers
from batchproof.engine.text.tokenizer import Tokenizer

# More than one: a compile of a big schema (up to ~1 s) holds one worker while the others keep
# computing every running row's masks (each ~0.1-1 ms); few, as masks mostly wait on one core.
GRAMMAR_WORKERS = 4
# How long a decode step waits for a constrained row's next mask to read the tokens it forces
# (speculative drafts): the mask takes microseconds, a worker's turn a little more.
FORCED_WAIT_S = 0.005
_workers = ThreadPoolExecutor(max_workers=GRAMMAR_WORKERS, thread_name_prefix="batchproof-grammar")


class GrammarFailure(RuntimeError):
    """This row's grammar cannot go on: it failed (`grammar_failed`: a limit on a mask's work, a
    token it could not take, a grammar that does not compile) or its mask came too late
    (`grammar_timeout`). The code is RequestOutput.error_code."""

    def __init__(self, message: str, code: str = "grammar_failed") -> None:
        super().__init__(message)
        self.code = code


def unpack_mask(bitmask: bytes, vocab_size: int) -> torch.Tensor:
    """llguidance's bitmask (bit i of little-endian word i // 32 is token i) -> bool [V].
    numpy's unpackbits, not torch's shifts: 0.04 ms at 262,144 tokens against 24 ms (torch's
    broadcast ops went through its thread pool, beside the forward pass's)."""
    bits = np.unpackbits(np.frombuffer(bitmask, dtype=np.uint8), bitorder="little")[:vocab_size]
    return torch.from_numpy(bits.view(np.bool_))


def _first_line(error: str) -> str:
    """llguidance's error without the parser state it appends (lines of the reply so far)."""
    lines = error.strip().splitlines()
    return lines[0] if lines else "unknown error"


class GrammarState:
    def __init__(self, tokenizer: Tokenizer, grammar: str) -> None:
        self.vocab_size = tokenizer.vocab_size
        self.is_stopped = False  # the grammar is complete and takes no further token
        self._matchers = compiled_matchers(tokenizer)
        self._grammar = grammar
        self._matcher = None
        self._next: Future[torch.Tensor | str] | None = None  # None until the sequence is admitted
        self._forced: list[int] = []  # the tokens the grammar forces next, found with each mask

    @property
    def is_started(self) -> bool:
        return self._next is not None

    @property
    def is_cancelled(self) -> bool:
        """Its pending job was dropped before any worker began it."""
        return self._next is not None and self._next.cancelled()

    def start(self) -> None:
        """Its matcher and first mask, on a grammar worker: once it is admitted to run, so a
        sequence that waits for a slot holds no worker (and compiles nothing)."""
        if self._next is None:
            self._next = _workers.submit(self._first_mask)

    def cancel(self) -> None:
        """The sequence has ended: its job, if no worker has begun it, never runs."""
        if self._next is not None:
            self._next.cancel()

    def _first_mask(self) -> torch.Tensor | str:
        try:
            self._matcher = self._matchers.matcher(self._grammar)
        except CompileError as e:  # the server checks first; an engine used alone may not have
            return f"it does not compile: {_first_line(str(e))}"
        return self._mask()

    def _mask(self) -> torch.Tensor | str:
        matcher = self._matcher
        self._forced = []
        try:
            if matcher.is_error():
                return _first_line(matcher.get_error())
            bitmask = matcher.compute_bitmask()
            # Tokens no other choice could follow (a JSON key, its quotes and colon): drafts that
            # are sure to be accepted, since the model can only pick what the mask allows.
            self._forced = [] if matcher.is_error() else list(matcher.compute_ff_tokens())
        except BaseException as e:  # a panic in llguidance (pyo3's PanicException is no Exception): this row's
            return f"llguidance raised {type(e).__name__}"
        if matcher.is_error():  # a limit on one step's work (llguidance's fuel), mid-reply
            return _first_line(matcher.get_error())
        return unpack_mask(bitmask, self.vocab_size)

    def forced(self) -> list[int]:
        """The tokens the grammar forces from here (found with the next mask, so this waits for
        that job, up to FORCED_WAIT_S: its work is microseconds); [] if it is not done by then."""
        if self._next is None or self.is_stopped:
            return []
        try:
            self._next.result(timeout=FORCED_WAIT_S)
        except BaseException:  # late, cancelled or failed: no draft from it (allowed() reports a failure)
            return []
        return list(self._forced)

    def allowed(self, timeout_s: float) -> torch.Tensor:
        """bool [V]: the tokens the grammar takes next (its end-of-turn ids once complete), if
        ready within `timeout_s` (a mask already computed is taken at 0)."""
        self.start()
        try:
            result = self._next.result(timeout=timeout_s)
        except TimeoutError:
            raise GrammarFailure("the grammar's next mask was not ready in time (the engine's "
                                 "grammar_mask_timeout_s)", "grammar_timeout") from None
        if isinstance(result, str):
            raise GrammarFailure(f"the grammar failed: {result}")
        return result

    def advance(self, token_id: int) -> None:
        """Take the chosen token, then start on the next mask."""
        self._next.result()  # allowed() has returned it: the matcher is this thread's now
        if not self._matcher.consume_token(token_id):
            raise GrammarFailure(f"the grammar refused token {token_id}: {_first_line(self._matcher.get_error())}")
        self.is_stopped = self._matcher.is_stopped()
        if not self.is_stopped:
            self._next = _workers.submit(self._mask)
