"""One replica of the fleet: an engine with its own KV cache and continuous batching, run by
Ray Serve. It is the single server's engine and AsyncEngine unchanged; only the doorway
differs (a Serve method instead of an HTTP route)."""

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

import ray
from ray import serve

from batchproof.engine.async_engine import AsyncEngine
from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.outputs import RequestOutput
from batchproof.engine.sampling.params import SamplingParams
from batchproof.fleet.loopback import bind_serve_grpc_to_node_address
from batchproof.fleet.registry import HEARTBEAT_S, get_registry
from batchproof.server.batch_log import BatchLog
from batchproof.server.errors import APIError
from batchproof.server.info import build_sha256, numerics_id
from batchproof.server.metrics import Metrics
from batchproof.server.serving import admit


@dataclass(frozen=True)
class Refused:
    """The replica would not take a request (its queue is full, its engine stopped): the
    ingress answers with this status, as the single server would."""

    status: int
    message: str
    type: str
    headers: dict[str, str]


class EngineReplica:
    def __init__(self, engine_config: EngineConfig, max_queue: int) -> None:
        bind_serve_grpc_to_node_address()  # Serve starts that server once this constructor returns
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.max_queue = max_queue
        self.metrics = Metrics()  # its batch-size histogram goes to the ingress's /metrics
        self.batch_log = BatchLog(self.metrics, None)
        self.engine = Engine(engine_config)
        self.async_engine = AsyncEngine(self.engine, engine_config.batch_window_ms / 1000, self.batch_log,
                                        replica_id=self.replica_id)
        self._started = threading.Lock()
        self._facts = {"id": self.replica_id, "host": socket.gethostname(), "pid": os.getpid(),
                       "node_id": ray.get_runtime_context().get_node_id(), "build_sha256": build_sha256()}
        self._registry = get_registry()
        self._reporter = threading.Thread(target=self._report_loop, name="batchproof-heartbeat", daemon=True)
        self._reporter.start()

    def _start_engine(self) -> None:
        """The engine thread hands deltas to the loop the requests wait on, which Serve only
        shows us inside a request."""
        with self._started:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
                self.async_engine.start(self._loop)

    async def generate(self, request_id: str, prompt_ids: list[int], params: SamplingParams
                       ) -> AsyncIterator[str | Refused | RequestOutput]:
        """First this replica's id (or why it refuses), then the request's deltas. Cancelling the
        call (the client left) aborts the sequence, which frees its slot."""
        self._start_engine()
        try:
            admit(self.async_engine, self.max_queue)
        except APIError as e:
            yield Refused(e.status, e.message, e.type, e.headers)
            return
        # Queued before the first yield: the next admission counts it (no --max-queue overshoot).
        opened = await self.async_engine.open(request_id, prompt_ids, params)
        yield self.replica_id
        async with contextlib.aclosing(opened.outputs):
            async for out in opened.outputs:
                yield out

    def check_health(self) -> None:
        """Serve restarts a replica whose engine thread died."""
        if self.async_engine.failure is not None:
            raise RuntimeError(f"engine stopped: {self.async_engine.failure!r}")

    def report(self) -> dict:
        info = self.engine.info()
        samples = [sample for metric in self.metrics.batch_size.collect() for sample in metric.samples]
        buckets = [(float(s.labels["le"]), s.value) for s in samples if s.name.endswith("_bucket")]
        total = sum(s.value for s in samples if s.name.endswith("_sum"))
        return {**self._facts, "decode_path": info["decode_path"], "numerics_id": numerics_id(info),
                "engine": info, "num_waiting": self.async_engine.num_waiting,
                "num_running": self.async_engine.num_running, "num_free_slots": self.async_engine.num_free_slots,
                "num_faults": self.async_engine.num_faults, "last_fault": self.async_engine.last_fault,
                "batch_size": {"buckets": buckets, "sum": total}}

    def _report_loop(self) -> None:
        while not self._stopping.wait(HEARTBEAT_S):
            try:
                self._registry.report.remote(self.replica_id, self.report())
            except Exception:  # the registry went with its fleet; the replica is going too
                return

    def __del__(self) -> None:
        """Serve's graceful shutdown: leave the registry at once, stop the engine thread."""
        self._stopping.set()
        try:
            self._registry.forget.remote(self.replica_id)
        except Exception:  # never registered (a failed start), or the registry is gone
            pass
        if self._loop is not None:
            self.async_engine.stop()


def as_deployment(num_replicas: int, num_cpus: int, num_gpus: int, max_ongoing: int):
    """The replica class as a Serve deployment. max_ongoing: requests Ray's router sends one
    replica at once, above what it can batch and queue, so the replica's own queue (and its
    429) decides, not the router's default of 5."""
    options = {"num_cpus": num_cpus} | ({"num_gpus": num_gpus} if num_gpus else {})
    return serve.deployment(EngineReplica, name="batchproof-engine").options(
        num_replicas=num_replicas, ray_actor_options=options, max_ongoing_requests=max_ongoing,
        health_check_period_s=2, health_check_timeout_s=30, graceful_shutdown_timeout_s=5)
