"""A sampled request's random numbers: a counter-based stream, the same on every host and with
every torch, so a seed means the same draws anywhere (docs/numerics.md, "A seeded draw").

Draw n (n = 0, 1, 2, ...) of seed s is SplitMix64's (n + 1)-th output from state s (Steele, Lea
and Flood, 2014: the state advances by the golden-ratio constant, the output is its mix),
its top 53 bits as a double in [0, 1). Integer arithmetic only, in Python: no library's
generator decides a bit (torch.multinomial's algorithm and torch.Generator's stream are
torch's, and have changed between releases). A draw is made only when a token is sampled,
so draw n is the one for the n-th sampled token of the sequence, speculative or not."""

STREAM = "splitmix64-v1"  # the name a receipt or a witness gives this stream
MASK = 2**64 - 1
GOLDEN = 0x9E3779B97F4A7C15


def splitmix64(state: int) -> int:
    """The output of SplitMix64 whose state (already advanced) is `state`."""
    z = state & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def uniform(seed: int, n: int) -> float:
    """Draw n of `seed`: a double in [0, 1), a multiple of 2^-53."""
    return (splitmix64(seed + (n + 1) * GOLDEN) >> 11) * 2.0**-53


class Draws:
    """One sequence's stream: its seed and how many draws it has made."""

    def __init__(self, seed: int) -> None:
        self.seed = seed & MASK
        self.count = 0

    def next(self) -> float:
        u = uniform(self.seed, self.count)
        self.count += 1
        return u
