"""m_formed: the largest batch a band formed, from every source the server offers."""

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any, TypeVar

import httpx

from batchproof.probe.wire.prometheus import (
    HISTOGRAM,
    Histogram,
    find_histogram,
    gauge,
    histograms_by,
    max_observed,
    parse_samples,
)

T = TypeVar("T")

# A fleet's /metrics labels each replica's batch-size series with this.
REPLICA_LABEL = "replica"
# Ours: `batch m=N done in <ms>ms (...)`; aprender's: `[PMAT-044] Batch m=N done`.
_BATCH_LINE = re.compile(r"(?<![A-Za-z])[Bb]atch m=(\d+) done")


def max_batch_in_log(text: str) -> int | None:
    """The largest N of the `batch m=N done` lines in `text`, or None if there are none."""
    sizes = [int(n) for n in _BATCH_LINE.findall(text)]
    return max(sizes) if sizes else None


def busy_slots(doc: Any) -> int | None:
    """How many of llama.cpp's `/slots` are processing (`is_processing`, or `state` 1)."""
    if not isinstance(doc, list) or not all(isinstance(s, dict) for s in doc):
        return None
    if not all("is_processing" in s or "state" in s for s in doc):
        return None
    return sum(1 for s in doc if s.get("is_processing") is True or s.get("state") == 1)


def choose(candidates: list[tuple[str, int | None]]) -> tuple[int, str | None]:
    """The first source, in order of preference, that saw a batch; else what answered 0."""
    for source, m in candidates:
        if m is not None and m > 0:
            return m, source
    for source, m in candidates:
        if m is not None:
            return 0, source
    return 0, None


def max_by_replica(before: dict[str, Histogram], after: dict[str, Histogram]) -> dict[str, int | None]:
    """Each replica's largest batch between two scrapes (0: it formed none). A band of c over
    N replicas forms about c/N on each; m_formed stays the largest batch one replica formed."""
    return {replica: max_observed(before.get(replica), hist) for replica, hist in after.items()}


class MFormedWatcher:
    """Watches one server while a band runs: its log, /metrics and /slots."""

    def __init__(
        self, client: httpx.AsyncClient, server_log: Path | None, settle_s: float, poll_s: float
    ) -> None:
        self._client = client
        self._server_log = server_log
        self._settle_s = settle_s
        self._poll_s = poll_s
        self.has_histogram = False
        self.has_gauge = False
        self.has_slots = False
        self._log_offset = 0
        self._before: Histogram | None = None
        self._before_by_replica: dict[str, Histogram] = {}

    async def detect(self) -> None:
        """Find out once which sources this server offers."""
        text = await self._metrics_text()
        samples = parse_samples(text) if text is not None else []
        # A labelled histogram has no series before its first observation; its TYPE line shows.
        declared = text is not None and f"# TYPE {HISTOGRAM} histogram" in text
        self.has_histogram = declared or find_histogram(samples) is not None
        self.has_gauge = gauge(samples) is not None
        self.has_slots = busy_slots(await self._get_json("/slots")) is not None

    async def measure(
        self, work: Awaitable[T], replicas_of: Callable[[T], Collection[str]] | None = None
    ) -> tuple[T, int, str | None, dict[str, int | None]]:
        """Run `work` (a band) and return its result with m_formed, its source, and each
        replica's largest batch when the histogram is labelled by replica ({} otherwise).
        `replicas_of` names the replicas that served `work`: each must record a batch."""
        self._mark_log()
        if self.has_histogram:
            self._before, self._before_by_replica = await self._histograms()
        busiest: list[int] = []
        sampler = None
        if not self.has_histogram and (self.has_slots or self.has_gauge):
            sampler = asyncio.create_task(self._sample_busy(busiest))
        try:
            result = await work
        finally:
            if sampler is not None:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
        log_m, hist_m, by_replica = await self._settle(set(replicas_of(result)) if replicas_of else set())
        busy_source = "slots" if self.has_slots else "metrics"
        busy_m = max(busiest) if busiest else None
        m, source = choose([("log", log_m), ("metrics", hist_m), (busy_source, busy_m)])
        return result, m, source, by_replica

    async def _settle(self, replicas: set[str]) -> tuple[int | None, int | None, dict[str, int | None]]:
        # A batch is recorded when it finishes, a few ms after its last stream may end;
        # one more read after the first record catches a batch that trailed it. A fleet's
        # replicas report their batches each on its own clock (about a second apart): with a
        # histogram labelled by replica, every replica that served must have recorded one.
        deadline = time.monotonic() + self._settle_s
        is_unwatched = self._server_log is None and not self.has_histogram
        while True:
            log_m, (hist_m, by_replica) = self._read_log(), await self._histogram_m()
            is_recorded = log_m is not None or (hist_m is not None and hist_m > 0)
            if by_replica and replicas:
                is_recorded = is_recorded and all(by_replica.get(r, 0) != 0 for r in replicas)
            if is_unwatched or time.monotonic() >= deadline:
                return log_m, hist_m, by_replica
            await asyncio.sleep(self._poll_s)
            if is_recorded:
                return self._read_log(), *await self._histogram_m()

    def _mark_log(self) -> None:
        if self._server_log is not None:
            with contextlib.suppress(OSError):
                self._log_offset = self._server_log.stat().st_size

    def _read_log(self) -> int | None:
        if self._server_log is None:
            return None
        try:
            with self._server_log.open("rb") as log:
                size = log.seek(0, 2)
                # A log smaller than the offset was truncated or rotated: read it all.
                log.seek(self._log_offset if size >= self._log_offset else 0)
                text = log.read().decode("utf-8", "replace")
        except OSError:
            return None
        return max_batch_in_log(text)

    async def _histogram_m(self) -> tuple[int | None, dict[str, int | None]]:
        # Without the scrape from before the band, a delta would count all history.
        if not self.has_histogram or self._before is None:
            return None, {}
        after, after_by_replica = await self._histograms()
        if after is None:
            return None, {}
        return max_observed(self._before, after), max_by_replica(self._before_by_replica, after_by_replica)

    async def _histograms(self) -> tuple[Histogram | None, dict[str, Histogram]]:
        """The histogram now (empty if it has no series yet), or None if /metrics failed; and
        its per-replica series on a fleet."""
        text = await self._metrics_text()
        if text is None:
            return None, {}
        samples = parse_samples(text)
        return find_histogram(samples) or Histogram(0.0, {}), histograms_by(samples, REPLICA_LABEL)

    async def _sample_busy(self, busiest: list[int]) -> None:
        while True:
            if self.has_slots:
                busy = busy_slots(await self._get_json("/slots"))
            else:
                text = await self._metrics_text()
                value = gauge(parse_samples(text)) if text is not None else None
                busy = None if value is None else int(value)
            if busy is not None:
                busiest.append(busy)
            await asyncio.sleep(self._poll_s)

    async def _metrics_text(self) -> str | None:
        try:
            response = await self._client.get("/metrics")
        except httpx.HTTPError:
            return None
        return response.text if response.is_success else None

    async def _get_json(self, path: str) -> Any:
        try:
            response = await self._client.get(path)
            return response.json() if response.is_success else None
        except (httpx.HTTPError, ValueError):
            return None
