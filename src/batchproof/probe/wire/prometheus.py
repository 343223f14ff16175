"""Just enough of the Prometheus text format to read a batch-size histogram and a gauge."""

import math
import re
from dataclasses import dataclass

HISTOGRAM = "batchproof_batch_size"
# Gauges of requests being decoded now: llama.cpp's, and vLLM's and SGLang's alike.
BUSY_GAUGES = ("llamacpp:requests_processing", "vllm:num_requests_running", "sglang:num_running_reqs")

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')

MetricSample = tuple[str, dict[str, str], float]


@dataclass(frozen=True)
class Histogram:
    """One histogram's cumulative counts, summed over any labels other than `le`."""

    count: float
    buckets: dict[float, float]


def parse_samples(text: str) -> list[MetricSample]:
    """Every sample line as (name, labels, value); comments and junk are skipped."""
    samples: list[MetricSample] = []
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match is None:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        samples.append((name, dict(_LABEL.findall(labels or "")), number))
    return samples


def _histogram_name(samples: list[MetricSample], name: str) -> str | None:
    names = {s[0].removesuffix("_count") for s in samples if s[0].endswith("_count")}
    if name in names:
        return name
    others = sorted(n for n in names if n.endswith("batch_size"))
    return others[0] if others else None


def _summed(samples: list[MetricSample], name: str) -> Histogram | None:
    count = sum(v for n, _, v in samples if n == f"{name}_count")
    buckets: dict[float, float] = {}
    for n, labels, v in samples:
        if n == f"{name}_bucket" and "le" in labels:
            try:
                bound = float(labels["le"])
            except ValueError:
                continue
            buckets[bound] = buckets.get(bound, 0.0) + v
    return Histogram(count, buckets) if buckets else None


def find_histogram(samples: list[MetricSample], name: str = HISTOGRAM) -> Histogram | None:
    """The histogram `name`, else any `*batch_size` histogram, else None.

    Summed over label sets: a fleet's per-replica series (label `replica`) add up to one
    histogram of every batch any replica formed, whose largest observation is the largest
    batch one replica formed, never a sum of two replicas' batches.
    """
    found = _histogram_name(samples, name)
    return None if found is None else _summed(samples, found)


def histograms_by(samples: list[MetricSample], label: str, name: str = HISTOGRAM) -> dict[str, Histogram]:
    """The histogram split by one label's value (a fleet's `replica`); {} when it has no such label."""
    found = _histogram_name(samples, name)
    if found is None:
        return {}
    series = (f"{found}_bucket", f"{found}_count")
    values = dict.fromkeys(labels[label] for n, labels, _ in samples if n in series and label in labels)
    split = {value: _summed([s for s in samples if s[1].get(label) == value], found) for value in values}
    return {value: hist for value, hist in split.items() if hist is not None}


def max_observed(before: Histogram | None, after: Histogram) -> int | None:
    """The largest observation between two scrapes: the smallest bound holding them all.

    0 when nothing was observed; None when only +Inf holds the largest one (unknown).
    """
    new = after.count - (before.count if before else 0.0)
    if new <= 0:
        return 0
    for bound in sorted(after.buckets):
        old = before.buckets.get(bound, 0.0) if before else 0.0
        if after.buckets[bound] - old >= new:
            return int(bound) if math.isfinite(bound) else None
    return None


def gauge(samples: list[MetricSample], names: tuple[str, ...] = BUSY_GAUGES) -> float | None:
    """The first of `names` present (summed over its label sets), or None."""
    for name in names:
        values = [v for n, _, v in samples if n == name]
        if values:
            return sum(values)
    return None
