"""Iteration-level scheduling in plain Python: who is prefilled, who decodes, who holds a slot
(the slots themselves are the cache manager's: taken and given back through it), and how many
prompt tokens a prefill step may feed while others decode (the pacer)."""

from collections import deque
from dataclasses import dataclass, field

from batchproof.engine.cache.manager import CacheManager
from batchproof.engine.sequence import Sequence, Status

# A newcomer whose prompt opens with at least this many tokens that a prompt still being fed will
# store in the prefix cache (and that the cache does not hold yet) waits for that prefill, when
# they are at least half of what it has left to feed, rather than computing them alongside:
# 16 requests at once with one long system prompt then compute it once, not 16 times, and
# none waits much longer than computing the shared part itself would take (SGLang's in-batch
# prefix caching deprioritizes such requests the same way, from 32 shared tokens).
MIN_SHARED_TOKENS = 32


# How many prompt tokens a prefill step may feed while other sequences decode.
# Before any step has been timed (or after nothing but decode steps), a prefill step beside
# decoding sequences feeds this many tokens; the timings then take over.
FIRST_BUDGET = 32


class PrefillPacer:
    """While others decode, prefill and decode steps alternate, and a prefill step may take
    `share` of a decode step's time: at the prompt tokens per second the last prefill step
    measured, that many tokens. Timing, not counting, because a token deep in a long prompt
    costs several times one near its start (its attention reads every position before it):
    a token budget let one 6,000-token prompt triple the others' per-token latency. Where the
    prompt is cut changes no bit (our kernels; the torch path keeps its own grid), so a budget
    that follows the clock is safe. With nothing decoding, a step feeds max_tokens."""

    def __init__(self, share: float, max_tokens: int) -> None:
        self.share = share
        self.max_tokens = max_tokens
        self._decode_s: float | None = None  # the last decode step's duration
        self._tokens_per_s: float | None = None  # the last prefill step's rate

    def observe_decode(self, seconds: float) -> None:
        self._decode_s = seconds

    def observe_prefill(self, num_tokens: int, seconds: float) -> None:
        if num_tokens > 0 and seconds > 0:
            self._tokens_per_s = num_tokens / seconds

    def budget(self, is_decoding: bool) -> int:
        if not is_decoding:
            return self.max_tokens
        if self._decode_s is None or self._tokens_per_s is None:
            return min(FIRST_BUDGET, self.max_tokens)
        return max(1, min(self.max_tokens, int(self.share * self._decode_s * self._tokens_per_s)))


@dataclass
class ScheduledStep:
    prefill: list[Sequence]  # prompts to feed this step
    decode: list[Sequence]
    # Aborted or finished since the last step: their slots already given back (emptied, the
    # prefix cache keeping what it wants first) before anyone admitted this step took one.
    retired: list[Sequence]
    prefill_tokens: list[int] = field(default_factory=list)  # how many of each prompt's tokens


class Scheduler:
    def __init__(self, caches: CacheManager, max_prefill_tokens: int, prefill_share: float = 0.5) -> None:
        self.caches = caches  # the one owner of the slots: the scheduler only says who takes and gives back
        self.pacer = PrefillPacer(prefill_share, max_prefill_tokens)
        self._prefilled_last = False
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledStep:
        """A prefill step or a decode step: while both have work they alternate, so a prompt
        however long delays each running stream by one short prefill step per token."""
        retired = self.retire()
        self._admit()
        self.caches.make_room(self.running)  # cached blocks make way for the running sequences
        prefilling = [s for s in self.running if s.is_prefilling]
        decoding = [s for s in self.running if not s.is_prefilling]
        if prefilling and not (decoding and self._prefilled_last):
            self._prefilled_last = True
            seqs, tokens = allot_prefill(prefilling, self.pacer.budget(is_decoding=bool(decoding)))
            return ScheduledStep(prefill=seqs, decode=[], retired=retired, prefill_tokens=tokens)
        self._prefilled_last = False
        return ScheduledStep(prefill=[], decode=decoding, retired=retired)

    def observe(self, step: ScheduledStep, seconds: float) -> None:
        """How long a step's forward pass took (the pacer's clock)."""
        if step.decode:
            self.pacer.observe_decode(seconds)
        elif step.prefill:
            self.pacer.observe_prefill(sum(step.prefill_tokens), seconds)

    def retire(self) -> list[Sequence]:
        """The aborted and finished leave: running ones give their slots back."""

        retired = [s for s in self.running if s.is_aborted or s.is_finished]
        for seq in retired:
            self.caches.free_slot(seq)
            seq.status = Status.FINISHED
        self.running = [s for s in self.running if s.status is Status.RUNNING]
        aborted_waiting = [s for s in self.waiting if s.is_aborted]
        for seq in aborted_waiting:
            seq.status = Status.FINISHED
        self.waiting = deque(s for s in self.waiting if not s.is_aborted)
        return retired + aborted_waiting

    def _admit(self) -> None:
        """Newcomers take free slots in arrival order, with what the prefix cache holds of their
        prompts; their prompts are fed in that order. One that waits for another's prefill
        (MIN_SHARED_TOKENS) keeps its place at the head while those behind it go on."""
        deferred = []
        while self.waiting and self.caches.num_free_slots:
            seq = self.waiting.popleft()
            if self._waits_for_a_prefill(seq):
                deferred.append(seq)
                continue
            self.caches.admit(seq)
            seq.status = Status.RUNNING
            self.running.append(seq)
        self.waiting.extendleft(reversed(deferred))

    def _waits_for_a_prefill(self, seq: Sequence) -> bool:
        for feeding in self.running:
            if feeding.is_prefilling:
                gain = self.caches.to_be_stored(seq, feeding)
                # what it has left to feed: from its cached blocks on, if its prefill has not started
                done = feeding.reused.num_tokens if feeding.reused is not None else feeding.num_computed
                if gain >= MIN_SHARED_TOKENS and 2 * gain >= feeding.prefill_len - done:
                    return True
        return False


def allot_prefill(prefilling: list[Sequence], budget: int) -> tuple[list[Sequence], list[int]]:
    """Share a prefill step's budget among the prompts being fed (in arrival order) -> the
    prompts this step feeds and how many tokens of each. The oldest gets up to half of it, so
    it always advances; the rest goes to the shortest remaining prompts first, so a short
    newcomer is not queued behind a long prompt's whole prefill; what is left, to the oldest."""
    remaining = [s.prefill_len - s.num_computed for s in prefilling]
    tokens = [0] * len(prefilling)
    tokens[0] = min(remaining[0], budget if len(prefilling) == 1 else max(1, budget // 2))
    left = budget - tokens[0]
    for i in sorted(range(1, len(prefilling)), key=lambda i: remaining[i]):
        tokens[i] = min(remaining[i], left)
        left -= tokens[i]
    tokens[0] += min(left, remaining[0] - tokens[0])
    chosen = [i for i in range(len(prefilling)) if tokens[i]]
    return [prefilling[i] for i in chosen], [tokens[i] for i in chosen]
