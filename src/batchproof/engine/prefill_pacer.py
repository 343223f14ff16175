"""How many prompt tokens a prefill step may feed while other sequences decode."""

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
