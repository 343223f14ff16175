"""What a decode step of n rows costs, relative to one row, and what a draft is expected to
give: the two sides of every choice of draft length.

STEP_COST: a single sequence's decode step of n rows on the default model, on a 2-core AMD
EPYC with AVX2 (the kernels' batchproof-avx2 path), the best of 25 runs, divided by the
one-row step (10.6 ms): up to 4 rows each block is unpacked in registers once for all of them
(quant_tiles), at 5 the matmuls switch to tiles of 8 rows, so 5 to 8 rows cost alike, and from
there each row adds about a quarter of a one-row step. Other machines differ in scale more
than in shape; a wrong table only makes drafts shorter or longer than best, never a bit
different."""

STEP_COST = {1: 1.0, 2: 1.17, 3: 1.51, 4: 1.79, 5: 3.40, 6: 3.56, 7: 3.80, 8: 3.79, 9: 4.55, 12: 4.78,
             16: 6.11, 24: 8.26}
_ROWS = sorted(STEP_COST)


def step_cost(rows: int) -> float:
    """The table, linear between its rows and past its end."""
    if rows in STEP_COST:
        return STEP_COST[rows]
    lower = max((r for r in _ROWS if r < rows), default=_ROWS[0])
    upper = min((r for r in _ROWS if r > rows), default=None)
    if upper is None:  # past the table: its last slope
        a, b = _ROWS[-2], _ROWS[-1]
        return STEP_COST[b] + (rows - b) * (STEP_COST[b] - STEP_COST[a]) / (b - a)
    return STEP_COST[lower] + (rows - lower) * (STEP_COST[upper] - STEP_COST[lower]) / (upper - lower)


def expected_accepted(p: float, k: int) -> float:
    """Tokens expected to be accepted of a k-token draft, each accepted with chance p once the
    one before it was: p + p^2 + ... + p^k."""
    return sum(p ** i for i in range(1, k + 1))
