"""Iteration-level scheduling in plain Python: who is prefilled, who decodes, which slot."""

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from batchproof.engine.sequence import Sequence, Status

# While others decode, a prefill step takes at most this many prompt tokens per decoding
# sequence (and at least PREFILL_FLOOR): a long prompt then costs each running stream about
# as much as one more stream would, instead of stalling them all for its whole prefill.
PREFILL_FLOOR = 32


@dataclass
class ScheduledStep:
    prefill: list[Sequence]  # prompts to feed (in order, up to prefill_budget tokens in all)
    decode: list[Sequence]
    retired: list[Sequence]  # aborted or finished since the last step; their slots are free again
    prefill_budget: int = 0


class Scheduler:
    def __init__(self, max_batch: int, max_prefill_tokens: int,
                 on_retire: Callable[[Sequence], None] | None = None, prefill_tokens_per_decode: int = 2) -> None:
        self.max_batch = max_batch
        self.on_retire = on_retire  # sees each sequence while its slot still holds its keys (then frees them)
        self.max_prefill_tokens = max_prefill_tokens
        self.prefill_tokens_per_decode = prefill_tokens_per_decode
        self._prefilled_last = False
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.free_slots: list[int] = list(range(max_batch - 1, -1, -1))  # pop() hands out slot 0 first

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledStep:
        """A prefill step or a decode step: while both have work they alternate, so a prompt
        however long delays each running stream by one bounded prefill step per token."""
        retired = self._retire()
        self._admit()
        prefilling = [s for s in self.running if s.is_prefilling]
        decoding = [s for s in self.running if not s.is_prefilling]
        if prefilling and not (decoding and self._prefilled_last):
            self._prefilled_last = True
            budget = self.max_prefill_tokens
            if decoding:
                budget = min(budget, max(PREFILL_FLOOR, self.prefill_tokens_per_decode * len(decoding)))
            return ScheduledStep(prefill=prefilling, decode=[], retired=retired, prefill_budget=budget)
        self._prefilled_last = False
        return ScheduledStep(prefill=[], decode=decoding, retired=retired)

    def _retire(self) -> list[Sequence]:
        retired = [s for s in self.running if s.is_aborted or s.status is Status.FINISHED]
        for seq in retired:
            if self.on_retire is not None:
                self.on_retire(seq)
            self.free_slots.append(seq.slot)
            seq.slot = None
            seq.status = Status.FINISHED
        self.running = [s for s in self.running if s.status is Status.RUNNING]
        aborted_waiting = [s for s in self.waiting if s.is_aborted]
        for seq in aborted_waiting:
            seq.status = Status.FINISHED
        self.waiting = deque(s for s in self.waiting if not s.is_aborted)
        return retired + aborted_waiting

    def _admit(self) -> None:
        """Newcomers take free slots in arrival order; their prompts are fed in that order."""
        while self.waiting and self.free_slots:
            seq = self.waiting.popleft()
            seq.slot = self.free_slots.pop()
            seq.status = Status.RUNNING
            self.running.append(seq)
