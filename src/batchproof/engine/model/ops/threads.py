"""How many threads a step may use: the cores no one else is using right now.

Every kernel call is a fork-join over `num_threads` OpenMP threads, hundreds of them a token.
When another process takes a core, one of our threads waits for that core at every join (a
scheduler time slice, milliseconds) while the other spins: issue 60 measured one busy neighbour
on a 2-core machine cutting decode to 2% of its speed (llama-server to 5%). With as many threads
as there are free cores, no join waits for a thread that is not running: one core of two free
gives one thread, about half the quiet speed.

The thread count never changes a bit: each output row's arithmetic is fixed whatever thread
computes it (the kernels' partition of rows between threads changes no sum's order), so the
count may follow the machine from one step to the next. Measured from /proc/stat (every CPU's
busy time) less our own process's, sampled at most every PERIOD_S; where there is no /proc
(not Linux) the count stays the configured one."""

import os
import time
from collections.abc import Callable

PERIOD_S = 0.25
# A window this long or longer (the engine sat idle) says little of now: the count goes back to the
# most and a new window starts. Measured: a server idle while a neighbour ran, then asked alone
# once it had left, decoded its first request at 0.71x its quiet rate on the stale count.
STALE_S = 1.0
# Another process's use, in cores, at which one of ours is given up: a neighbour that wants a
# whole core shows ~1.0; the probe client or a shell beside the server 0.1-0.3.
YIELD_AT_CORES = 0.6


CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc's unit of CPU time


def read_machine() -> tuple[float, float]:
    """(seconds every allowed CPU was busy, seconds of CPU our process used), cumulative."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # all but idle and iowait
    with open("/proc/self/stat") as f:
        own = f.read().rsplit(")", 1)[1].split()
    return busy / CLOCK_TICKS, (int(own[11]) + int(own[12])) / CLOCK_TICKS  # utime, stime


class ThreadShare:
    """The thread count for the next step: at most `max_threads`, at least 1, one less for each
    core's worth of other processes' use (rounded at YIELD_AT_CORES)."""

    def __init__(self, max_threads: int, num_cpus: int | None = None,
                 read: Callable[[], tuple[float, float]] | None = read_machine,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_threads = max_threads
        self.num_threads = max_threads
        self.num_cpus = num_cpus or _allowed_cpus()
        self._read, self._clock = read, clock
        self._last: tuple[float, float, float] | None = None
        if self._read is not None:
            try:
                self._last = (clock(), *self._read())
            except OSError:  # no /proc: the count stays
                self._read = None

    def now(self) -> int:
        if self._read is None or self.max_threads == 1:
            return self.num_threads
        at = self._clock()
        if at - self._last[0] >= STALE_S:
            self._last = (at, *self._read())
            self.num_threads = self.max_threads
        elif at - self._last[0] >= PERIOD_S:
            busy, own = self._read()
            others = max(0.0, (busy - self._last[1]) - (own - self._last[2])) / (at - self._last[0])
            self._last = (at, busy, own)
            free = self.num_cpus - others
            self.num_threads = max(1, min(self.max_threads, int(free + 1 - YIELD_AT_CORES)))
        return self.num_threads


def _allowed_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
