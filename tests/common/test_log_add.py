"""The wire's log-add (common/log_add.py): exact to a couple of ulp against a 60-digit decimal
reference, and the same bits on every host: a digest of 200,000 fixed pairs pinned here, and the
same digest from a process whose glibc runs its non-FMA variants (a host without FMA), where the
C library's exp and log1p gave other bits."""

import hashlib
import math
import os
import struct
import subprocess
import sys
from decimal import Decimal, getcontext

import pytest

from batchproof.common.log_add import fixed_exp, fixed_log1p, log_add

# sha256 of the 200,000 results' doubles (big-endian) for _pairs(); any change of the formula,
# its constants or its order changes it (and every joined tail a reply shows).
DIGEST = "745c7dc6b4d3d7ec596ce6396ff89ae1e7148fa9506bd61c548c9dd3e67b4cee"


def _float32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def _pairs(n: int = 200_000) -> list[tuple[float, float]]:
    """Fixed float32 logprob pairs in [-64, 0] (an integer LCG, no library RNG), with -inf and
    equal pairs among them."""
    state, pairs = 12345, []
    for i in range(n):
        values = []
        for _ in range(2):
            state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
            values.append(-(state >> 40) / 2**24 * 64.0)
        a, b = (float(_float32(struct.unpack("<I", struct.pack("<f", v))[0])) for v in values)
        if i % 997 == 0:
            b = -math.inf
        if i % 1009 == 0:
            b = a
        pairs.append((a, b))
    return pairs


def _digest(pairs: list[tuple[float, float]]) -> str:
    return hashlib.sha256(b"".join(struct.pack(">d", log_add(a, b)) for a, b in pairs)).hexdigest()


def _ulps(a: float, b: float) -> int:
    return abs(struct.unpack("<q", struct.pack("<d", a))[0] - struct.unpack("<q", struct.pack("<d", b))[0])


@pytest.fixture(autouse=True, scope="module")
def _precision():
    old = getcontext().prec
    getcontext().prec = 60
    yield
    getcontext().prec = old


def test_exp_within_one_ulp() -> None:
    xs = [-i / 997.0 for i in range(0, 20_000)] + [-700.0 + i / 7.0 for i in range(0, 4_800)] + [-744.0, -1e-300]
    assert max(_ulps(fixed_exp(x), float(Decimal(x).exp())) for x in xs) <= 1
    assert fixed_exp(0.0) == fixed_exp(-0.0) == 1.0
    assert fixed_exp(-math.inf) == 0.0 and fixed_exp(-746.0) == 0.0
    assert math.isnan(fixed_exp(math.nan))


def _exact_log1p(y: float) -> float:
    d = Decimal(y)
    if y < 1e-12:  # 1 + y would round away y's digits at 60 digits: the series instead
        return float(d - d * d / 2 + d * d * d / 3)
    return float((1 + d).ln())


def test_log1p_within_two_ulp() -> None:
    ys = [i / 20_000 for i in range(20_001)] + [2.0 ** -e for e in range(1, 1070)] + [0.41421356237309503,
                                                                                        0.414213562373095]
    assert max(_ulps(fixed_log1p(y), _exact_log1p(y)) for y in ys) <= 2
    assert fixed_log1p(0.0) == 0.0 and fixed_log1p(5e-324) == 5e-324


def test_domain() -> None:
    with pytest.raises(ValueError, match="x <= 0"):
        fixed_exp(0.5)
    with pytest.raises(ValueError, match="0 <= y <= 1"):
        fixed_log1p(1.5)


def test_log_add_as_exact_as_the_libm_formula() -> None:
    """The final add's rounding dominates: within an ulp of the result plus two of log1p's
    range, as high + log1p(exp(low - high)) with the C library's functions."""
    for a, b in _pairs(20_000):
        got = log_add(a, b)
        if b == -math.inf:
            assert got == a
            continue
        exact = (Decimal(a).exp() + Decimal(b).exp()).ln()
        assert abs(Decimal(got) - exact) <= Decimal(math.ulp(got)) + Decimal(2 * math.ulp(0.5)), (a, b)
    assert log_add(-math.inf, -2.0) == -2.0 and log_add(-math.inf, -math.inf) == -math.inf
    assert log_add(-1.0, -2.0) == log_add(-2.0, -1.0)


def test_the_same_bits_on_every_host() -> None:
    """The digest pinned above, here and in a process whose glibc takes its non-FMA variants
    (which changed 5 of 200,000 libm log-adds on an x86 with FMA): no C library decides a bit."""
    pairs = _pairs()
    assert _digest(pairs) == DIGEST
    code = ("from tests.common.test_log_add import _digest, _pairs; print(_digest(_pairs()))")
    env = {**os.environ, "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-FMA,-AVX2,-FMA4"}
    other = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                           timeout=120)
    assert other.stdout.strip() == DIGEST
