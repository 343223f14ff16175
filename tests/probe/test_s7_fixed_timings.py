"""S7 on fixed timings: the probe's rates from given arrival times, judged by the check. (Tests of
the probe's wiring against a scripted server set S7 aside: their rates are the machine's.)"""

from pathlib import Path

import pytest

from batchproof.probe.judge.verdict import band_rate
from batchproof.probe.records.liveness import decode_rate
from tests.helpers.check_support import C1, C4, check_witness, control


def arrivals(tokens: int, span_s: float, start_s: float = 0.0) -> list[float]:
    """One content arrival per token, evenly over `span_s`."""
    return [start_s + span_s * k / (tokens - 1) for k in range(tokens)]


def rate(tokens: int, span_s: float) -> float:
    return decode_rate(True, arrivals(tokens, span_s), tokens)


@pytest.mark.parametrize(("c4_span_s", "verdict", "reasons"), [
    (0.25, 0, []),  # 11 tokens in 0.25 s: 44 tok/s, exactly half of c=1's 88 (binary fractions: exact)
    (0.2551, 5, ["S7: decode at c=4 is 43.1 tok/s, 49.0% of c=1's 88.0 tok/s; the contract needs at least 50%"]),
    # One decimal would read 50.0%: the share keeps the digits that show it fails.
    (0.25011, 5, ["S7: decode at c=4 is 44.0 tok/s, 49.98% of c=1's 88.0 tok/s; the contract needs at least 50%"]),
])
def test_s7_reads_the_median_slot_rate_of_c1_and_c4(tmp_path: Path, c4_span_s: float, verdict: int,
                                                     reasons: list[str]) -> None:
    d1 = band_rate([rate(12, 0.125)])
    # Four slots: the median of an even count is the mean of the middle two; the outliers do not move it.
    d4 = band_rate([rate(12, c4_span_s), rate(12, c4_span_s), rate(12, 0.05), rate(12, 5.0)])
    assert d1 == 88.0
    witness = control()
    witness["bands"][C1]["decode_tok_s"], witness["bands"][C4]["decode_tok_s"] = d1, d4
    assert check_witness(tmp_path, witness) == (verdict, reasons)


def test_an_untimed_slot_leaves_the_band_unrated(tmp_path: Path) -> None:
    assert decode_rate(False, arrivals(12, 0.1), 12) is None  # a buffered stream is never timed
    assert band_rate([rate(12, 0.1), None]) is None
    witness = control()
    witness["bands"][C4]["decode_tok_s"] = band_rate([rate(12, 0.1), None])
    assert check_witness(tmp_path, witness) == (5, ["S7 unmeasured at c=4 (no positive decode_tok_s)"])
