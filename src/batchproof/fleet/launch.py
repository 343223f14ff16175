"""Bringing a fleet up: Ray (local or joined), the registry, the replicas, then the ingress app."""

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import ray
from fastapi import FastAPI
from ray import serve

from batchproof.engine.config import EngineConfig
from batchproof.engine.model.front import ModelFront
from batchproof.engine.model.known_models import resolve_model
from batchproof.fleet.config import FleetConfig
from batchproof.fleet.loopback import LOOPBACK, keep_ray_on_loopback, require_loopback_node
from batchproof.fleet.metrics import use_replica_batch_sizes
from batchproof.fleet.registry import NAMESPACE, start_registry
from batchproof.fleet.replica import as_deployment
from batchproof.fleet.router import FleetBackend, ReplicaReports
from batchproof.server.app import create_app
from batchproof.server.config import ServerConfig

APP_NAME = "batchproof"
REPORTS_WAIT_S = 30.0
SHUTDOWN_S = 15.0


def _uses_gpu(engine_config: EngineConfig) -> bool:
    if engine_config.device == "auto":
        import torch

        return torch.cuda.is_available()
    return engine_config.device.startswith("cuda")


def start_ray(fleet: FleetConfig) -> None:
    """Join a cluster, or start a local instance with room for every replica on this machine."""
    if fleet.address is not None:
        ray.init(address=fleet.address, namespace=NAMESPACE, log_to_driver=False)
        return
    cpus = max(os.cpu_count() or 1, fleet.replicas * fleet.threads_per_replica)
    # One machine: every Ray listener on loopback, so nobody on the network reaches Ray's APIs
    # (they run code) past --api-key. A cluster across machines is secured as docs/fleet.md says.
    keep_ray_on_loopback()
    ray.init(num_cpus=cpus, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False,
             _node_ip_address=LOOPBACK)
    require_loopback_node()


def start_replicas(fleet: FleetConfig, server_config: ServerConfig, engine_config: EngineConfig):
    """Deploy the replicas and wait until each has loaded its model -> Ray's handle to them."""
    serve.start(proxy_location="Disabled")  # the ingress is ours: the same app as `batchproof serve`
    replica_config = replace(engine_config, num_threads=fleet.threads_per_replica)
    gpus = 1 if _uses_gpu(engine_config) else 0
    deployment = as_deployment(fleet.replicas, fleet.threads_per_replica, gpus,
                               max_ongoing=engine_config.max_batch + server_config.max_queue)
    return serve.run(deployment.bind(replica_config, server_config.max_queue), name=APP_NAME, route_prefix=None)


def _wait_for_reports(reports: ReplicaReports, count: int) -> None:
    deadline = time.monotonic() + REPORTS_WAIT_S
    while sum(r["alive"] for r in reports.latest()) < count and time.monotonic() < deadline:
        time.sleep(0.1)


def fleet_app(fleet: FleetConfig, server_config: ServerConfig, engine_config: EngineConfig
              ) -> tuple[FastAPI, Callable[[], None]]:
    """Start Ray and the replicas (blocking until they serve) -> the ingress app and a shutdown."""
    start_ray(fleet)
    try:
        print(f"batchproof fleet: starting {fleet.replicas} replicas of {fleet.threads_per_replica} thread(s)",
              file=sys.stderr)
        registry = start_registry()  # before the replicas, which report to it
        handle = start_replicas(fleet, server_config, engine_config)
        front = ModelFront.read(resolve_model(engine_config.model_path), engine_config)
        reports = ReplicaReports(registry)
        _wait_for_reports(reports, fleet.replicas)
    except BaseException:
        shutdown()
        raise

    def start(state, loop) -> FleetBackend:
        use_replica_batch_sizes(state.metrics, reports)
        return FleetBackend(handle, front, reports)

    return create_app(server_config, engine_config, start=start), shutdown


def shutdown() -> None:
    """Serve's graceful shutdown, for at most SHUTDOWN_S (it retries for ever if a Ray process
    has already gone); then Ray's, which ends whatever is left of a local instance."""
    graceful = threading.Thread(target=serve.shutdown, name="batchproof-serve-shutdown", daemon=True)
    graceful.start()
    graceful.join(SHUTDOWN_S)
    ray.shutdown()
