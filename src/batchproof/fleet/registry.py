"""Who is in the fleet: each replica reports itself every HEARTBEAT_S to one named actor,
and the ingress reads the reports. Ray's router picks replicas but does not say which are
up or what they run; a report that stops arriving marks its replica down within STALE_S,
on one machine or many."""

import time

import ray

REGISTRY_NAME = "batchproof-registry"
NAMESPACE = "batchproof"
HEARTBEAT_S = 0.5
STALE_S = 2.5  # five missed reports: down


@ray.remote(num_cpus=0)
class Registry:
    def __init__(self) -> None:
        self._reports: dict[str, dict] = {}
        self._seen: dict[str, float] = {}

    def report(self, replica_id: str, report: dict) -> None:
        self._reports[replica_id] = report
        self._seen[replica_id] = time.monotonic()

    def forget(self, replica_id: str) -> None:
        """A replica shutting down cleanly leaves at once rather than going stale."""
        self._reports.pop(replica_id, None)
        self._seen.pop(replica_id, None)

    def snapshot(self) -> list[dict]:
        """Every replica reported, with `alive` and its report's age; the long dead are dropped."""
        now = time.monotonic()
        for replica_id in [r for r, seen in self._seen.items() if now - seen > 60]:
            self.forget(replica_id)
        return [{**report, "alive": now - self._seen[replica_id] <= STALE_S,
                 "report_age_s": round(now - self._seen[replica_id], 3)}
                for replica_id, report in sorted(self._reports.items())]


def get_registry():
    return ray.get_actor(REGISTRY_NAME, namespace=NAMESPACE)


def start_registry():
    """One per fleet, owned by the `batchproof fleet` process, which must hold the handle: Ray
    ends an actor when its owner's last handle goes."""
    registry = Registry.options(name=REGISTRY_NAME, namespace=NAMESPACE, get_if_exists=True).remote()
    ray.get(registry.snapshot.remote())  # up and named before any replica looks it up
    return registry
