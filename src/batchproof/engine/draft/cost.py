"""What a decode step of n rows costs, relative to one row, and what a draft is expected to
give: the two sides of every choice of draft length.

StepCost is an engine's own: the table below until the engine has timed its decode steps, then
the table's shape bent to the timings (which differ by machine, numerics and model: on a Zen 4
with AVX-512 the default model's float32 matmuls at 2 rows cost about 1.6 of one row, 8.3 against
5.2 ms, bench/results/step-cost-zen4.json and docs/numerics.md, not 1.17).

STEP_COST: a single sequence's decode step of n rows on the default model, on a 2-core AMD
EPYC with AVX2 (the kernels' batchproof-avx2 path), the best of 25 runs, divided by the
one-row step (10.6 ms): up to 4 rows each block is unpacked in registers once for all of them
(quant_tiles_body.h), 5 to 8 in the AVX2 tall tile (one weight row, 8 rows of x: quant_tiles_avx2.c),
and from 9 the matmuls unpack into a buffer, each row adding about a quarter of a one-row step.
Rows 5-8 were 3.40-3.79 through the buffer until the tall tile; they are its matmuls' cost on the
same Zen 3 (bench/step_cost.py --max-isa avx2, two runs: 5 rows 2.25, 6 2.32-2.58, 8 3.06-3.22; 7
between). Other machines differ in scale more than in shape; a wrong table only makes drafts
shorter or longer than best, never a bit different."""

from collections import deque
from statistics import median

STEP_COST = {1: 1.0, 2: 1.17, 3: 1.51, 4: 1.79, 5: 2.25, 6: 2.45, 7: 2.80, 8: 3.14, 9: 4.55, 12: 4.78,
             16: 6.11, 24: 8.26}
_ROWS = sorted(STEP_COST)


def _between(points: dict[int, float], rows: int) -> float:
    """points' value at `rows`: linear between the nearest two around it, the nearest's outside them."""
    lower = max((r for r in points if r <= rows), default=min(points))
    upper = min((r for r in points if r >= rows), default=max(points))
    if lower == upper:
        return points[lower]
    return points[lower] + (rows - lower) * (points[upper] - points[lower]) / (upper - lower)


def step_cost(rows: int) -> float:
    """The table, linear between its rows and past its end."""
    if rows > _ROWS[-1]:  # past the table: its last slope
        a, b = _ROWS[-2], _ROWS[-1]
        return STEP_COST[b] + (rows - b) * (STEP_COST[b] - STEP_COST[a]) / (b - a)
    return _between(STEP_COST, rows)


def expected_accepted(p: float, k: int) -> float:
    """Tokens expected to be accepted of a k-token draft, each accepted with chance p once the
    one before it was: p + p^2 + ... + p^k."""
    return sum(p ** i for i in range(1, k + 1))


class StepCost:
    """step_cost(rows) of this engine: the table's value times a correction measured here. Each
    decode step's time is kept per row count (the last WINDOW); once a row count has MIN_SAMPLES,
    its median over the smallest such row count's, times that one's table value, is its cost, and
    row counts between two measured ones take the table's shape between them (outside, the
    nearest's correction). A median ignores the odd step a busy machine slows; the correction
    only moves which drafts pay, never a bit."""

    WINDOW = 15
    MIN_SAMPLES = 3
    MAX_ROWS = 32  # held as a table to this many rows (a lookup per draft considered); past it, its last correction
    REFRESH = 16  # steps between recomputing the table (~0.1 ms each), and whenever a row count is first known

    def __init__(self) -> None:
        self._seconds: dict[int, deque[float]] = {}
        self._observed = 0
        self._table = {rows: step_cost(rows) for rows in range(1, self.MAX_ROWS + 1)}

    def __call__(self, rows: int) -> float:
        if rows <= self.MAX_ROWS:
            return self._table[rows]
        return step_cost(rows) * (self._table[self.MAX_ROWS] / step_cost(self.MAX_ROWS))

    @property
    def rows_timed(self) -> list[int]:
        """The row counts whose steps have been timed."""
        return sorted(self._seconds)

    def observe(self, rows: int, seconds: float) -> None:
        """A decode step of `rows` rows took `seconds`."""
        if not 1 <= rows <= self.MAX_ROWS:
            return
        times = self._seconds.setdefault(rows, deque(maxlen=self.WINDOW))
        times.append(seconds)
        self._observed += 1
        if len(times) == self.MIN_SAMPLES or (len(times) > self.MIN_SAMPLES and self._observed % self.REFRESH == 0):
            self._table = self._measured_table()

    def _measured_table(self) -> dict[int, float]:
        medians = {rows: median(t) for rows, t in sorted(self._seconds.items()) if len(t) >= self.MIN_SAMPLES}
        anchor = min(medians)
        # correction at each measured row count: measured cost / table cost (1 at the anchor)
        factor = {rows: medians[rows] / medians[anchor] * step_cost(anchor) / step_cost(rows) for rows in medians}
        return {rows: step_cost(rows) * _between(factor, rows) for rows in range(1, self.MAX_ROWS + 1)}
