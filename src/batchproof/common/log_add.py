"""log(exp(a) + exp(b)) in doubles, by IEEE-754's basic operations only, so that every host gets
the same bits.

The wire joins the alternatives a reply does not show to its tail by log-add-exp (a completions
reply that kept more alternatives for prompt_logprobs than `logprobs` shows), and the notary
repeats it to check the reply. With the C library's `exp` and `log1p` those bits were the libm's:
glibc picks FMA or plain variants by CPU, so an x86 host without FMA gave another last bit than
one with it (5 of 200,000 fixed pairs; docs/arm.md), and another libm may differ anywhere.

Here there is no libm: a fixed range reduction and fixed polynomials in `+ - * /` (each one
correctly rounded by IEEE-754, and CPython contracts nothing into an FMA), `math.floor` and
`math.ldexp` (exact). Within 2 ulp of the exact value (tests hold it to
`math.log1p(math.exp(.))` and to a decimal reference); the same bits on x86, ARM or anything
that runs CPython with IEEE doubles."""

import math

# fdlibm's split of ln 2: LN2_HI has 21 trailing zero bits, so k * LN2_HI is exact for |k| < 2**21.
LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
INV_LN2 = 1.44269504088896338700e+00
EXP_UNDERFLOW = -745.2
TINY = 2.0 ** -54  # exp(x) below half the least subnormal: 0.0

# exp(r) = sum r**n / n! for |r| <= ln2 / 2: the first term left out (r**15 / 15!) is below 2**-62.
_EXP_TERMS = tuple(1.0 / math.factorial(n) for n in range(15))
# 2 atanh(s) = 2 (s + s**3/3 + s**5/5 ...) for |s| <= 3 - 2 sqrt(2) (~0.17): the first term left
# out (s**25 / 25) is below 2**-66 of s.
_ATANH_TERMS = tuple(1.0 / n for n in range(3, 24, 2))


def fixed_exp(x: float) -> float:
    """exp(x) for x <= 0 (the log-add's argument): 2**k * exp(r), x = k ln2 + r."""
    if x != x:
        return x
    if x < EXP_UNDERFLOW:
        return 0.0
    if x > 0.0:
        raise ValueError(f"fixed_exp takes x <= 0, got {x!r}")
    k = math.floor(x * INV_LN2 + 0.5)
    r = (x - k * LN2_HI) - k * LN2_LO
    p = 0.0
    for coefficient in reversed(_EXP_TERMS):  # Horner, highest power first
        p = p * r + coefficient
    return math.ldexp(p, k)


def fixed_log1p(y: float) -> float:
    """log(1 + y) for 0 <= y <= 1 (exp of a non-positive difference)."""
    if y != y:
        return y
    if not 0.0 <= y <= 1.0:
        raise ValueError(f"fixed_log1p takes 0 <= y <= 1, got {y!r}")
    if y < TINY:  # log1p(y) = y - y**2/2 ... rounds to y (and y / 2 would lose a subnormal's bits)
        return y
    k = 0
    if y > 0.41421356237309503:  # 1 + y > sqrt(2): log(1 + y) = ln2 + log1p((y - 1) / 2)
        k, y = 1, (y - 1.0) * 0.5  # exact: Sterbenz, then a halving
    s = y / (2.0 + y)  # log1p(y) = 2 atanh(s), |s| <= 3 - 2 sqrt(2)
    s2 = s * s
    p = 0.0
    for coefficient in reversed(_ATANH_TERMS):
        p = p * s2 + coefficient
    series = 2.0 * s + 2.0 * s * s2 * p
    return k * LN2_HI + (k * LN2_LO + series)


def log_add(a: float, b: float) -> float:
    """log(exp(a) + exp(b)) for logprobs (<= 0, -inf allowed): the larger plus log1p of the
    smaller's share, so tiny values keep their digits."""
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    high, low = max(a, b), min(a, b)
    return high + fixed_log1p(fixed_exp(low - high))
