"""The ingress's way to the replicas: it stands in for the local AsyncEngine behind the same
server routes. Ray's router (the deployment handle) picks a replica per request; this admits
the request there, names the replica, and turns a replica's death into a clean error."""

import asyncio
import threading
from collections.abc import AsyncIterator

import ray

from batchproof.engine.async_engine import Opened
from batchproof.engine.model.front import ModelFront
from batchproof.engine.outputs import RequestOutput
from batchproof.engine.sampling.params import SamplingParams
from batchproof.fleet.registry import HEARTBEAT_S
from batchproof.fleet.replica import Refused
from batchproof.server.errors import APIError

OPEN_ATTEMPTS = 3  # a replica that died before taking the request: try another
OPEN_TIMEOUT_S = 30.0  # no replica took it in this long (all down, Ray restarting them): 503


class FleetDown(RuntimeError):
    pass


class FleetFront:
    """The model's facts for the routes (read from the GGUF header here, as every replica reads
    them), and the fleet's replicas for /v1/server_info."""

    prefix_cache = None  # each replica has its own; their counters are in their reports

    def __init__(self, front: ModelFront, replicas: "ReplicaReports") -> None:
        self.front = front
        self.replicas = replicas

    def chat_prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        return self.front.chat_prompt_ids(messages, tools)

    def info(self) -> dict:
        """A live replica's engine facts (every replica runs the same configuration), and the fleet."""
        reports = self.replicas.latest()
        alive = [r for r in reports if r["alive"]]
        engine = (alive or reports)[0]["engine"] if reports else {}
        listed = [{key: r[key] for key in ("id", "host", "pid", "node_id", "decode_path", "build_sha256",
                                           "numerics_id", "alive", "num_running", "num_waiting")}
                  for r in reports]
        return {**engine, "fleet": {"replicas": listed, "num_alive": len(alive),
                                    "numerics_agree": len({r["numerics_id"] for r in alive}) <= 1}}


class ReplicaReports:
    """The registry's reports, fetched every HEARTBEAT_S on a thread of the ingress."""

    def __init__(self, registry) -> None:
        self._registry = registry
        self._reports: list[dict] = ray.get(registry.snapshot.remote())
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="batchproof-fleet-reports", daemon=True)
        self._thread.start()

    def latest(self) -> list[dict]:
        return self._reports

    def _poll(self) -> None:
        while not self._stopping.wait(HEARTBEAT_S):
            try:
                self._reports = ray.get(self._registry.snapshot.remote(), timeout=10)
            except Exception:  # Ray is going down with the fleet
                return

    def stop(self) -> None:
        self._stopping.set()


class FleetBackend:
    """What the server runs requests through when the engines are replicas elsewhere."""

    # No WeightControl: each replica holds its own weights and queue, so /v1/load_weights and the
    # control plane (/pause, /resume, /abort_requests, /is_paused, /weight_info) answer a 501.
    control = None

    def __init__(self, handle, front: ModelFront, reports: ReplicaReports) -> None:
        self._handle = handle.options(stream=True)
        self._reports = reports
        self.engine = FleetFront(front, reports)

    @property
    def failure(self) -> BaseException | None:
        if any(r["alive"] for r in self._reports.latest()):
            return None
        return FleetDown("no replica of the fleet is up (Ray restarts failed replicas)")

    def _sum(self, key: str) -> int:
        return sum(r[key] for r in self._reports.latest() if r["alive"])

    @property
    def num_faults(self) -> int:
        """Steps that raised in the live replicas (each failed only its own requests there)."""
        return self._sum("num_faults")

    @property
    def last_fault(self) -> str | None:
        return next((r["last_fault"] for r in self._reports.latest() if r["alive"] and r["last_fault"]), None)

    @property
    def num_waiting(self) -> int:
        # The replicas each hold their own queue and refuse past --max-queue; the ingress adds none.
        return 0

    @property
    def num_running(self) -> int:
        return self._sum("num_running")

    @property
    def num_free_slots(self) -> int:
        return self._sum("num_free_slots")

    async def open(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> Opened:
        problem: BaseException | None = None
        for _ in range(OPEN_ATTEMPTS):
            response = self._handle.generate.remote(request_id, prompt_ids, params)
            try:
                async with asyncio.timeout(OPEN_TIMEOUT_S):
                    first = await response.__anext__()
            except (Exception, asyncio.CancelledError) as e:
                response.cancel()
                if isinstance(e, asyncio.CancelledError):
                    raise
                problem = e  # nothing was sent yet: another replica may take it
                continue
            if isinstance(first, Refused):
                raise APIError(first.status, first.message, type_=first.type, headers=first.headers)
            return Opened(first, self._outputs(response, first, request_id, len(prompt_ids)))
        raise APIError(503, f"no replica of the fleet took the request ({type(problem).__name__}: {problem})",
                       type_="service_unavailable", headers={"Retry-After": "1"})

    @staticmethod
    async def _outputs(response, replica: str, request_id: str, num_prompt_tokens: int
                       ) -> AsyncIterator[RequestOutput]:
        """The replica's deltas; if it dies mid-request, one last delta that says so (the route
        turns it into a 503, or an error event if the stream had begun). Leaving early
        cancels the call, which aborts the sequence on the replica."""
        finished = False
        try:
            async for out in response:
                finished = out.finish_reason is not None
                yield out
        except Exception as e:
            finished = True
            yield RequestOutput(request_id, "", [], num_prompt_tokens, 0, finish_reason="unavailable",
                                error=f"replica {replica} failed mid-request ({type(e).__name__}); "
                                      "Ray restarts it, the other replicas serve on")
        finally:
            if not finished:
                response.cancel()

    def stop(self) -> None:
        self._reports.stop()
