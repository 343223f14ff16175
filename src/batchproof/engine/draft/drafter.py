"""One sequence's drafting: its n-gram index, its measured acceptance, the draft length that
acceptance pays for, and its counts (proposed, accepted) for /metrics and the log."""

from collections.abc import Callable

from batchproof.engine.draft.cost import expected_accepted, step_cost
from batchproof.engine.draft.lookup import NgramIndex

# Draft lengths tried: k drafted tokens make a step of k + 1 rows, and 2, 4, 8 and 16 rows are
# where the kernels' row tiles are full (cost.py).
LENGTHS = (1, 3, 7, 15)
# The estimate's memory: each verified draft's counts enter at full weight, older ones fade
# by this much per draft, so a sequence that moves from copying to free text adapts in a few steps.
DECAY = 0.7
# After a draft wholly rejected the sequence proposes nothing for 1, 3, 7, 15, then 31 steps:
# in free text a match rarely predicts the next token, and each rejected row costs a share of
# a step, so trying costs a few rows in a hundred steps there.
MAX_WAIT = 31


class Drafter:
    def __init__(self, prompt_ids: list[int], max_len: int, cost: Callable[[int], float] = step_cost) -> None:
        self.index = NgramIndex(prompt_ids)
        self._cost = cost  # a step of n rows, relative to one (the engine's StepCost)
        self._num_prompt_tokens = len(prompt_ids)
        self.lengths = tuple(sorted({k for k in LENGTHS if k < max_len} | {max_len}))
        # Per-token acceptance as counts: drafted positions tried (each after an accepted one) and
        # accepted, decayed; the prior (one of two) starts a new sequence at one half.
        self._tried, self._accepted = 2.0, 1.0
        self._wait = 0
        self._misses = 0
        self.num_forced = 0  # how many of the current draft's tokens a grammar forces (first)
        self.num_proposed = 0
        self.num_accepted = 0
        # A draft the step did not verify (its rows did not pay), held to be checked against the
        # tokens the step chose instead: evidence at no cost, so a batch too full for probes still
        # learns that its sequences copy (four identical prompts repeat one another's text).
        self._shadow: list[int] = []
        self._shadow_at = 0  # len(output_ids) when the shadow was proposed
        self.num_shadowed = 0

    @property
    def acceptance(self) -> float:
        """The estimated chance that a drafted token is accepted, given the one before it was."""
        return self._accepted / self._tried

    def _value(self, k: int) -> float:
        """Tokens per unit of cost of a step with a k-token draft, alone (1 without one)."""
        return (1 + expected_accepted(self.acceptance, k)) / self._cost(k + 1)

    @property
    def length(self) -> int:
        """The draft length that this acceptance pays for best, alone in a step; 1 when none pays
        (a probe: the step keeps it only where a row is cheap, propose.py)."""
        best = max(self.lengths, key=self._value)
        return best if self._value(best) > 1 else 1

    @property
    def is_probing(self) -> bool:
        """Nothing measured yet (verified or shadowed), or no draft length pays at this
        acceptance: a draft now measures it (a step keeps it only where a row is cheap, propose.py)."""
        return self.num_proposed + self.num_shadowed == 0 or self._value(self.length) <= 1

    def propose(self, output_ids: list[int], room: int, forced: list[int] | None = None) -> list[int]:
        """The draft for the next step (at most `room` tokens), having first indexed the reply's
        new tokens: the tokens a grammar forces from here where there are any (sure to be
        accepted: no wait, no estimate), else a prompt-lookup match; [] while waiting after
        misses or when nothing matches."""
        seen = len(self.index.token_ids) - self._num_prompt_tokens
        self.index.extend(output_ids[seen:])
        self._check_shadow(output_ids)
        self.num_forced = min(len(forced or ()), max(room, 0))
        if self.num_forced:
            return list(forced[:self.num_forced])
        if self._wait:
            self._wait -= 1
            return []
        return self.index.draft(min(self.length, room)) if room > 0 else []

    def shadow(self, draft: list[int], num_output_tokens: int) -> None:
        """The step verifies none of `draft`, proposed after `num_output_tokens` tokens of the
        reply: the next propose checks it against the tokens chosen instead. A grammar's forced
        tokens are no evidence of copying (observe), so they are not held."""
        if not self.num_forced:
            self._shadow, self._shadow_at = list(draft), num_output_tokens

    def _check_shadow(self, output_ids: list[int]) -> None:
        """A held draft against the tokens the reply took since: its positions revealed so far
        enter the estimate as a verified draft's would (each accepted one, and the first that
        differs). No back-off on a miss: a shadow cost no row."""
        shadow, self._shadow = self._shadow, []
        revealed = min(len(shadow), len(output_ids) - self._shadow_at)
        if revealed <= 0:
            return
        accepted = 0
        while accepted < revealed and output_ids[self._shadow_at + accepted] == shadow[accepted]:
            accepted += 1
        self.num_shadowed += 1
        self._tried = DECAY * self._tried + accepted + (accepted < revealed)
        self._accepted = DECAY * self._accepted + accepted

    def observe(self, num_proposed: int, num_accepted: int) -> None:
        """A verified draft: its positions tried (each accepted one, and the first rejected)."""
        self.num_proposed += num_proposed
        self.num_accepted += num_accepted
        # A grammar's forced tokens say nothing about how well the reply copies: left out.
        forced, self.num_forced = self.num_forced, 0
        if forced:
            return
        tried = num_accepted + (num_accepted < num_proposed)
        self._tried = DECAY * self._tried + tried
        self._accepted = DECAY * self._accepted + num_accepted
        if num_accepted == 0:
            self._misses += 1
            self._wait = min(MAX_WAIT, 2 ** self._misses - 1)
        else:
            self._misses = 0
