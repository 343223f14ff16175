"""Reading m_formed: log lines, our batch-size histogram, llama.cpp's /slots and gauge."""

import pytest

from batchproof.probe.wire.m_formed import busy_slots, choose, max_batch_in_log, max_by_replica
from batchproof.probe.wire.prometheus import (
    Histogram,
    find_histogram,
    gauge,
    histograms_by,
    max_observed,
    parse_samples,
)


def test_log_lines_in_both_spellings() -> None:
    log = (
        "INFO batch m=1 done in 812ms (40.1 tok/s/slot)\n"
        "[PMAT-044] Batch m=4 done\n"
        "INFO batch m=3 done in 900ms (30.0 tok/s/slot)\n"
    )
    assert max_batch_in_log(log) == 4
    assert max_batch_in_log("starting\nrequest 1 queued\n") is None
    assert max_batch_in_log("microbatch m=9 done\nbatch m=2 started\n") is None


def histogram_text(counts: dict[int, int], total: int | None = None) -> str:
    bounds = [*range(1, 17), 24, 32, 48, 64, 128]
    lines = ["# HELP batchproof_batch_size sequences per batch", "# TYPE batchproof_batch_size histogram"]
    running = 0
    for bound in bounds:
        running += counts.get(bound, 0)
        lines.append(f'batchproof_batch_size_bucket{{le="{float(bound)}"}} {running}.0')
    n = running if total is None else total
    lines += [
        f'batchproof_batch_size_bucket{{le="+Inf"}} {n}.0',
        f"batchproof_batch_size_count {n}.0",
        f"batchproof_batch_size_sum {sum(b * c for b, c in counts.items())}.0",
        "batchproof_batch_size_created 1.7e9",
    ]
    return "\n".join(lines) + "\n"


def test_histogram_buckets_parse_numerically() -> None:
    hist = find_histogram(parse_samples(histogram_text({1: 2, 4: 1})))
    assert hist is not None and hist.count == 3.0
    assert hist.buckets[1.0] == 2.0 and hist.buckets[4.0] == 3.0 and hist.buckets[float("inf")] == 3.0


def test_the_largest_batch_between_two_scrapes() -> None:
    before = find_histogram(parse_samples(histogram_text({1: 2, 16: 1})))
    after = find_histogram(parse_samples(histogram_text({1: 3, 4: 1, 16: 1})))
    assert after is not None
    assert max_observed(before, after) == 4  # the old 16 is history, not this band
    assert max_observed(after, after) == 0  # nothing new observed
    assert max_observed(None, after) == 16


def test_an_observation_only_plus_inf_holds_is_unknown() -> None:
    before = Histogram(0.0, {1.0: 0.0, float("inf"): 0.0})
    after = Histogram(1.0, {1.0: 0.0, float("inf"): 1.0})
    assert max_observed(before, after) is None


def test_histograms_with_extra_labels_are_summed_and_other_names_accepted() -> None:
    text = (
        'vllm_batch_size_bucket{model="a",le="2.0"} 1\n'
        'vllm_batch_size_bucket{model="a",le="8.0"} 1\n'
        'vllm_batch_size_bucket{model="b",le="2.0"} 0\n'
        'vllm_batch_size_bucket{model="b",le="8.0"} 1\n'
        'vllm_batch_size_count{model="a"} 1\n'
        'vllm_batch_size_count{model="b"} 1\n'
    )
    hist = find_histogram(parse_samples(text))
    assert hist == Histogram(2.0, {2.0: 1.0, 8.0: 2.0})
    assert find_histogram(parse_samples("requests_total 3\n")) is None


def fleet_text(per_replica: dict[str, dict[int, int]]) -> str:
    """A fleet's /metrics: one batch-size series per replica (label `replica`)."""
    lines = ["# TYPE batchproof_batch_size histogram"]
    for replica, counts in per_replica.items():
        running = 0
        for bound in [1, 2, 4, 8, 16]:
            running += counts.get(bound, 0)
            lines.append(f'batchproof_batch_size_bucket{{replica="{replica}",le="{float(bound)}"}} {running}.0')
        lines.append(f'batchproof_batch_size_bucket{{replica="{replica}",le="+Inf"}} {running}.0')
        lines.append(f'batchproof_batch_size_count{{replica="{replica}"}} {running}.0')
    return "\n".join(lines) + "\n"


def test_a_fleet_band_of_16_over_two_replicas_forms_8_not_16() -> None:
    before = parse_samples(fleet_text({"a": {1: 2}, "b": {1: 2}}))
    after = parse_samples(fleet_text({"a": {1: 2, 8: 1}, "b": {1: 2, 8: 1}}))
    # Summing the replicas' buckets keeps every batch as its own observation: the largest is 8.
    assert max_observed(find_histogram(before), find_histogram(after)) == 8
    assert max_by_replica(histograms_by(before, "replica"), histograms_by(after, "replica")) == {"a": 8, "b": 8}


def test_a_replica_whose_series_appears_during_the_band() -> None:
    before = histograms_by(parse_samples(fleet_text({"a": {1: 2}})), "replica")
    after = histograms_by(parse_samples(fleet_text({"a": {1: 2}, "b": {4: 1}})), "replica")
    assert list(after) == ["a", "b"] and after["b"] == Histogram(1.0, {1.0: 0.0, 2.0: 0.0, 4.0: 1.0, 8.0: 1.0,
                                                                         16.0: 1.0, float("inf"): 1.0})
    assert max_by_replica(before, after) == {"a": 0, "b": 4}


def test_a_histogram_without_the_label_splits_into_nothing() -> None:
    assert histograms_by(parse_samples(histogram_text({1: 2})), "replica") == {}
    assert histograms_by(parse_samples("requests_total 3\n"), "replica") == {}


def test_the_llamacpp_gauge() -> None:
    text = (
        "# HELP llamacpp:requests_processing Number of requests processing.\n"
        "# TYPE llamacpp:requests_processing gauge\n"
        "llamacpp:requests_processing 3\n"
        "llamacpp:prompt_tokens_total 120\n"
    )
    assert gauge(parse_samples(text)) == 3.0
    assert gauge(parse_samples("other 1\n")) is None
    vllm = 'vllm:num_requests_running{model_name="m"} 7.0\nvllm:num_requests_waiting 0.0\n'
    assert gauge(parse_samples(vllm)) == 7.0


def test_busy_slots_in_both_llamacpp_shapes() -> None:
    assert busy_slots([{"id": 0, "is_processing": True}, {"id": 1, "is_processing": False}]) == 1
    assert busy_slots([{"id": 0, "state": 1}, {"id": 1, "state": 1}, {"id": 2, "state": 0}]) == 2
    assert busy_slots([]) == 0
    assert busy_slots({"error": "slots disabled"}) is None
    assert busy_slots([{"id": 0}]) is None


@pytest.mark.parametrize(
    ("candidates", "expected"),
    [
        ([("log", 4), ("metrics", 3), ("slots", 2)], (4, "log")),
        ([("log", None), ("metrics", 3), ("slots", 2)], (3, "metrics")),
        ([("log", None), ("metrics", 0), ("slots", 2)], (2, "slots")),
        ([("log", None), ("metrics", 0), ("slots", None)], (0, "metrics")),
        ([("log", None), ("metrics", None), ("slots", None)], (0, None)),
    ],
)
def test_sources_are_preferred_in_order(candidates: list, expected: tuple) -> None:
    assert choose(candidates) == expected
