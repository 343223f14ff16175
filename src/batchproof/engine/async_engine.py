"""The engine's own thread, and the asyncio side that submits requests and reads their deltas."""

import asyncio
import os
import queue
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from batchproof.engine.engine import BatchSummary, Engine
from batchproof.engine.sampling_params import SamplingParams
from batchproof.engine.sequence import RequestOutput

# A burst rarely arrives in one instant (each request is parsed and tokenized in turn),
# so an idle engine keeps waiting while arrivals keep coming, up to this long in all.
MAX_GATHER_S = 1.0


@dataclass
class Opened:
    """A request admitted by an engine: who runs it, and its deltas until it finishes."""

    replica: str  # the id of the engine running it (a fleet's replies name it in a header)
    outputs: AsyncIterator[RequestOutput]


@dataclass
class _Add:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    sink: asyncio.Queue


@dataclass
class _Abort:
    request_id: str


class AsyncEngine:
    """One thread owns the engine; everything else talks to it through `_inbox`."""

    def __init__(self, engine: Engine, batch_window_s: float,
                 on_batch: Callable[[BatchSummary], None] = lambda summary: None, replica_id: str = "") -> None:
        self.engine = engine
        self.replica_id = replica_id or f"{socket.gethostname()}-{os.getpid()}"
        self.batch_window_s = batch_window_s
        self.on_batch = on_batch
        self._inbox: queue.Queue = queue.Queue()
        self._sinks: dict[str, asyncio.Queue] = {}  # engine thread only
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="batchproof-engine", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.failure: BaseException | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._inbox.put(None)
        self._thread.join(timeout=10)

    @property
    def num_waiting(self) -> int:
        """Requests submitted and not yet running (the queue depth)."""
        return self.engine.num_waiting + self._inbox.qsize()

    @property
    def num_running(self) -> int:
        return self.engine.num_running

    @property
    def num_free_slots(self) -> int:
        return len(self.engine.scheduler.free_slots)

    async def open(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> Opened:
        """The one way the server starts a request (a fleet's stand-in answers the same call
        after a replica has taken it); the request is queued when its deltas are first read."""
        return Opened(self.replica_id, self.generate(request_id, prompt_ids, params))

    async def generate(self, request_id: str, prompt_ids: list[int], params: SamplingParams
                       ) -> AsyncIterator[RequestOutput]:
        """Deltas for one request until it finishes; leaving early aborts it in the engine."""
        sink: asyncio.Queue = asyncio.Queue()
        self._inbox.put(_Add(request_id, prompt_ids, params, sink))
        finished = False
        try:
            while True:
                out = await sink.get()
                finished = out.finish_reason is not None
                yield out
                if finished:
                    return
        finally:
            if not finished:  # the client left, timed out or the handler failed
                self._inbox.put(_Abort(request_id))

    # --- the engine thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                if not self.engine.has_work():
                    if not self._take(block=True):
                        continue
                    self._gather()
                self._take(block=False)
                outputs = self.engine.step()
                self._deliver(outputs)
                summary = self.engine.take_batch_summary()
                if summary is not None:
                    self.on_batch(summary)
        except BaseException as e:  # a bug: fail every waiting request rather than hang them
            self.failure = e
            self._fail_all(f"engine stopped: {type(e).__name__}: {e}")
            raise

    def _take(self, block: bool, timeout: float | None = None) -> bool:
        """Apply inbox commands; True if a request arrived."""
        arrived = False
        while True:
            try:
                command = self._inbox.get(block=block, timeout=timeout)
            except queue.Empty:
                return arrived
            block = False
            if command is None:
                return arrived
            if isinstance(command, _Add):
                try:
                    self.engine.add_request(command.request_id, command.prompt_ids, command.params)
                except ValueError as e:  # refused alone; the engine and the others go on
                    failed = RequestOutput(command.request_id, "", [], len(command.prompt_ids), 0,
                                           finish_reason="error", error=f"the request was refused: {e}")
                    self._loop.call_soon_threadsafe(_put_all, [(command.sink, failed)])
                    continue
                self._sinks[command.request_id] = command.sink
                arrived = True
            elif command.request_id in self._sinks:
                self.engine.abort(command.request_id)

    def _gather(self) -> None:
        """An idle engine waits for the rest of a burst: until batch_window passes with no arrival."""
        deadline = time.monotonic() + MAX_GATHER_S
        while self.batch_window_s > 0 and time.monotonic() < deadline:
            if not self._take(block=True, timeout=self.batch_window_s):
                return

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        ready = []
        for out in outputs:
            sink = self._sinks.get(out.request_id)
            if out.finish_reason is not None:
                self._sinks.pop(out.request_id, None)
            if sink is not None:
                ready.append((sink, out))
        if ready:
            self._loop.call_soon_threadsafe(_put_all, ready)

    def _fail_all(self, message: str) -> None:
        ready = [(sink, RequestOutput(rid, "", [], 0, 0, finish_reason="error", error=message))
                 for rid, sink in self._sinks.items()]
        self._sinks.clear()
        if ready and self._loop is not None:
            self._loop.call_soon_threadsafe(_put_all, ready)


def _put_all(ready: list[tuple[asyncio.Queue, RequestOutput]]) -> None:
    for sink, out in ready:
        sink.put_nowait(out)
