"""Logprob parity over the agreeing prefix: exact zero for a batch-invariant server."""

from batchproof.probe.judge.logprob_parity import UNMEASURED, LogprobParity, combine, compare

REF = [(-0.1, -0.1, -2.0), (-0.5, -0.5, -1.0), (-0.2, -0.2, -3.0)]


def test_identical_vectors_are_bitwise_equal_with_zero_difference() -> None:
    assert compare(REF, list(REF), 3) == LogprobParity(0.0, True, None, None)


def test_the_largest_difference_and_the_first_position_are_named() -> None:
    slot = [REF[0], (-0.5, -0.5, -1.00001), (-0.2 + 3e-5, -0.2 + 3e-5, -3.0)]
    parity = compare(REF, slot, 3)
    assert parity.is_bitwise_equal is False and parity.first_diff_at == 1 and parity.max_diff_at == 2
    assert abs(parity.max_abs_diff - 3e-5) < 1e-12


def test_only_the_agreeing_prefix_is_compared() -> None:
    slot = [REF[0], REF[1], (-9.0, -9.0, -9.5)]
    assert compare(REF, slot, 2).is_bitwise_equal is True


def test_minus_zero_is_not_bitwise_zero_and_a_missing_value_differs() -> None:
    assert compare([(0.0,)], [(-0.0,)], 1).is_bitwise_equal is False
    parity = compare([(-0.1, -0.1)], [(-0.1, None)], 1)
    assert parity.is_bitwise_equal is False and parity.max_abs_diff == 0.0 and parity.first_diff_at == 0


def test_no_numbers_to_compare_is_unmeasured() -> None:
    assert compare([(None,)], [(None,)], 1) == UNMEASURED
    assert compare(REF, REF, 0) == UNMEASURED


def test_a_band_is_bitwise_only_if_every_slot_is() -> None:
    equal, differ = LogprobParity(0.0, True), LogprobParity(1e-5, False, 4, 7)
    assert combine([equal, equal]) == LogprobParity(0.0, True)
    assert combine([equal, differ]) == differ
    assert combine([equal, UNMEASURED]).is_bitwise_equal is None
    assert combine([UNMEASURED]) == UNMEASURED
