"""The replicas' batch-size histograms on the ingress's /metrics, one series per replica
(label `replica`): batches form inside each replica, so only they can count them."""

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from batchproof.server.metrics import Metrics


class ReplicaBatchSizes:
    def __init__(self, reports) -> None:
        self._reports = reports  # ReplicaReports

    def collect(self):
        family = HistogramMetricFamily("batchproof_batch_size",
                                       "per completed batch: the most sequences decoded together, per replica",
                                       labels=["replica"])
        for report in self._reports.latest():
            histogram = report["batch_size"]
            buckets = [(floatToGoString(le), count) for le, count in histogram["buckets"]]
            family.add_metric([report["id"]], buckets, histogram["sum"])
        yield family


def use_replica_batch_sizes(metrics: Metrics, reports) -> None:
    """The ingress forms no batches: its own histogram gives way to the replicas'."""
    metrics.registry.unregister(metrics.batch_size)
    metrics.registry.register(ReplicaBatchSizes(reports))
