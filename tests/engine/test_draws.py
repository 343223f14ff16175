"""The draws' stream is the documented one: SplitMix64 from the seed, each output's top 53 bits.
Its numbers are recorded here, so a host or a torch release that drew other numbers (as
torch.Generator's stream may) fails, and a seed means the same draws everywhere."""

from batchproof.engine.sampling.draws import Draws, splitmix64, uniform


def test_splitmix64_is_the_reference_generator():
    """The reference C implementation's first outputs from state 1234567."""
    state, outputs = 1234567, []
    for _ in range(3):
        state += 0x9E3779B97F4A7C15
        outputs.append(splitmix64(state))
    assert outputs == [6457827717110365317, 3203168211198807973, 9817491932198370423]


def test_a_seed_s_draws_are_recorded_numbers():
    assert [uniform(0, n) for n in range(3)] == [0.8833108082136426, 0.43152799704850997, 0.026433771592597743]
    draws = Draws(2**64 + 5)  # seeds are taken modulo 2^64 (a request's may be negative: -(2^63)..2^64)
    assert [draws.next() for _ in range(4)] == [uniform(5, n) for n in range(4)] and draws.count == 4
    assert Draws(-1).seed == 2**64 - 1


def test_draws_are_uniform_enough():
    values = [uniform(42, n) for n in range(20000)]
    assert all(0.0 <= v < 1.0 for v in values)
    assert abs(sum(values) / len(values) - 0.5) < 0.01
    assert abs(sum(v < 0.1 for v in values) / len(values) - 0.1) < 0.01
