"""Iteration-level scheduling in plain Python: who is prefilled, who decodes, which slot."""

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from batchproof.engine.sequence import Sequence, Status


@dataclass
class ScheduledStep:
    prefill: list[Sequence]
    decode: list[Sequence]
    retired: list[Sequence]  # aborted or finished since the last step; their slots are free again


class Scheduler:
    def __init__(self, max_batch: int, max_prefill_tokens: int,
                 on_retire: Callable[[Sequence], None] | None = None) -> None:
        self.max_batch = max_batch
        self.on_retire = on_retire  # sees each sequence while its slot still holds its keys (then frees them)
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.free_slots: list[int] = list(range(max_batch - 1, -1, -1))  # pop() hands out slot 0 first

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledStep:
        retired = self._retire()
        prefill = self._admit()
        # Newcomers are prefilled on their own step; everyone else decodes on the next.
        decode = [] if prefill else list(self.running)
        return ScheduledStep(prefill=prefill, decode=decode, retired=retired)

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

    def _admit(self) -> list[Sequence]:
        admitted: list[Sequence] = []
        budget = self.max_prefill_tokens
        while self.waiting and self.free_slots:
            seq = self.waiting[0]
            if admitted and len(seq.prompt_ids) > budget:
                break  # the first newcomer always goes, however long (prefill chunks it)
            self.waiting.popleft()
            budget -= len(seq.prompt_ids)
            seq.slot = self.free_slots.pop()
            seq.status = Status.RUNNING
            self.running.append(seq)
            admitted.append(seq)
        return admitted
