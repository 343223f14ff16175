"""The engine's own thread, and the asyncio side that submits requests and reads their deltas."""

import asyncio
import os
import queue
import secrets
import socket
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from batchproof.engine.engine import BatchSummary, Engine
from batchproof.engine.inbox import ABORTED_BY_REQUEST, Abort, Add, Control, PauseMode, Swap, WeightSwap
from batchproof.engine.outputs import RequestOutput
from batchproof.engine.sampling.params import SamplingParams

# A step that raises fails its own requests and the engine goes on; this many in a row mean
# the engine itself is broken (a fault before anyone is scheduled repeats for ever): it stops.
MAX_CONSECUTIVE_FAULTS = 3
# A burst rarely arrives in one instant (each request is parsed and tokenized in turn),
# so an idle engine keeps waiting while arrivals keep coming, up to this long in all.
MAX_GATHER_S = 1.0


@dataclass
class Opened:
    """A request admitted by an engine: who runs it, and its deltas until it finishes."""

    replica: str  # the id of the engine running it (a fleet's replies name it in a header)
    outputs: AsyncIterator[RequestOutput]


class _Deltas:
    """One queued request's deltas. Closing it (or dropping it unread) before the final delta
    aborts the request, so a request queued at admission never runs for a reader that left."""

    def __init__(self, sink: asyncio.Queue, abort: Callable[[], None]) -> None:
        self._sink = sink
        self._abort = abort
        self._finished = False

    def __aiter__(self) -> "_Deltas":
        return self

    async def __anext__(self) -> RequestOutput:
        if self._finished:
            raise StopAsyncIteration
        out = await self._sink.get()
        self._finished = out.finish_reason is not None
        return out

    async def aclose(self) -> None:
        self._close()

    def __del__(self) -> None:
        self._close()

    def _close(self) -> None:
        if not self._finished:  # the client left, timed out or the handler failed
            self._finished = True
            self._abort()


class AsyncEngine:
    """One thread owns the engine; everything else talks to it through `_inbox`."""

    def __init__(self, engine: Engine, batch_window_s: float,
                 on_batch: Callable[[BatchSummary], None] = lambda summary: None, replica_id: str = "",
                 on_failure: Callable[[], None] = lambda: None) -> None:
        self.engine = engine
        self.on_failure = on_failure  # called on the engine thread once it has stopped for good
        self.replica_id = replica_id or f"{socket.gethostname()}-{os.getpid()}"
        self.batch_window_s = batch_window_s
        self.on_batch = on_batch
        self._inbox: queue.Queue = queue.Queue()
        self._sinks: dict[str, asyncio.Queue] = {}  # engine thread only
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="batchproof-engine", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.failure: BaseException | None = None  # the engine stopped for good
        self.num_faults = 0  # steps that raised; their requests failed and the engine went on
        self.last_fault: str | None = None
        self._consecutive_faults = 0
        # Requests put in the inbox and taken from it: each counter has one writer (the event
        # loop, the engine thread), so their difference needs no lock; aborts are not counted.
        self._num_put = 0
        self._num_taken = 0
        # A weight swap waiting for the engine to drain, and the requests that arrived after it
        # (engine thread only); the lock lets one load_weights read a checkpoint at a time.
        self._swap: Swap | None = None
        self._held: list[Add] = []
        self._swap_lock: asyncio.Lock | None = None
        # Paused (/pause): arrivals are held as for a swap; in keep mode no step runs. A pause in
        # abort or wait mode is answered once the engine is idle (engine thread only).
        self.pause_mode: PauseMode | None = None
        self._pause_waiters: list[tuple[asyncio.Future, int]] = []  # (its answer, the requests it aborted)

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
        return self.engine.num_waiting + self._num_put - self._num_taken

    @property
    def num_running(self) -> int:
        return self.engine.num_running

    @property
    def num_free_slots(self) -> int:
        return self.engine.num_free_slots

    async def open(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> Opened:
        """The one way the server starts a request (a fleet's stand-in answers the same call
        after a replica has taken it). The request is queued at once, with no await between
        the server's admission and here: the queue depth counts it before the next request is
        admitted, so simultaneous arrivals cannot overshoot --max-queue."""
        return Opened(self.replica_id, self._queue(request_id, prompt_ids, params))

    def _queue(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> _Deltas:
        sink: asyncio.Queue = asyncio.Queue()
        self._num_put += 1
        self._inbox.put(Add(request_id, prompt_ids, params, sink))
        return _Deltas(sink, lambda: self._inbox.put(Abort(request_id)))

    async def load_weights(self, path: Path, version: str | None = None, keep: bool = False) -> WeightSwap:
        """Replace the weights in place: read and build `path` on a worker thread while requests
        keep running, then swap as soon as every request admitted before the swap has finished
        (on the old weights); requests arriving meanwhile wait and run on the new ones. With
        `keep`, or while paused in keep mode, the swap happens at once, mid-generation (see
        Swap). The new weights are labelled `version` (default: their hash's). A checkpoint that
        cannot replace these weights raises ModelLoadError and nothing changes."""
        if self._swap_lock is None:
            self._swap_lock = asyncio.Lock()
        async with self._swap_lock:
            prepared = await asyncio.to_thread(self.engine.prepare_weights, path)
            done = asyncio.get_running_loop().create_future()
            self._inbox.put(Swap(prepared, version, keep, done))
            drain_s, swap_s, mode, num_refilled = await done
        return WeightSwap(prepared.load_s, drain_s, swap_s, mode, num_refilled)

    async def pause(self, mode: PauseMode) -> int:
        """Stop admitting (arrivals wait for /resume) and deal with the requests in flight as
        `mode` says; answered once that is done -> how many requests were aborted."""
        return await self._command("pause", mode=mode)

    async def resume(self) -> int:
        """Step again and admit what arrived while paused -> how many requests that admitted."""
        return await self._command("resume")

    async def abort_requests(self, request_ids: list[str] | None) -> int:
        """End these requests (a reply's id ends every choice of it; None: every request in
        flight) with finish_reason "abort", paused or not -> how many."""
        return await self._command("abort", request_ids=None if request_ids is None else frozenset(request_ids))

    async def _command(self, action: str, **fields) -> int:
        done = asyncio.get_running_loop().create_future()
        self._inbox.put(Control(action, done, **fields))
        return await done

    @property
    def is_paused(self) -> bool:
        return self.pause_mode is not None

    def weight_info(self) -> dict:
        """The version served now (vLLM's /weight_info), and what it names."""
        engine = self.engine
        return {"weight_version": engine.weight_version, "model_sha256": engine.model_sha256,
                "model_path": str(engine.model_path), "loaded_at": engine.weights_loaded_at,
                "is_paused": self.is_paused, "pause_mode": self.pause_mode}

    # --- the engine thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._between_steps()
                if not self._can_step():
                    if self._take(block=True) and self._can_step():
                        self._gather()
                    continue
                self._take(block=False)
                if not self._can_step():  # (a keep-mode pause just arrived)
                    continue
                self._deliver(self._step())
                self._report_batch()
        except BaseException as e:  # a bug: fail every waiting request rather than hang them
            self.failure = e
            # The exception's text can name files: it goes to the log (traceback below), not to clients.
            self._fail_all(f"the engine stopped ({type(e).__name__}; the server's log has the details)")
            if not self._stopping.is_set():
                self.on_failure()
            raise

    def _step(self) -> list:
        """engine.step(); if it raises, only that step's requests fail (500s, error events)."""
        try:
            outputs = self.engine.step()
        except Exception as e:
            self.num_faults += 1
            self.last_fault = f"{type(e).__name__}: {e}"  # for /health, to a key holder only
            self._consecutive_faults += 1
            # The requests get the fault's id, not its text (which can name files); the log has both.
            fault_id = secrets.token_hex(6)
            print(f"batchproof: engine step failed (fault {fault_id}, {self._consecutive_faults} in a row); "
                  "failing its requests", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
            if self._consecutive_faults >= MAX_CONSECUTIVE_FAULTS:
                raise
            return self.engine.fail_step(f"the engine step failed (fault {fault_id}: the server's log has the "
                                         f"details)")
        self._consecutive_faults = 0
        return outputs

    def _can_step(self) -> bool:
        return self.engine.has_work() and self.pause_mode != "keep"

    def _between_steps(self) -> None:
        """A swap that may go in now goes in; pauses waiting for the engine to go idle are answered."""
        if self._swap is not None and (self._swap.keep or self.pause_mode == "keep" or not self.engine.has_work()):
            self._install_swap()
        if self._pause_waiters and not self.engine.has_work():
            waiters, self._pause_waiters = self._pause_waiters, []
            for done, num_aborted in waiters:
                self._loop.call_soon_threadsafe(_settle, done, num_aborted)

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
            if isinstance(command, Swap):
                self._swap = command
            elif isinstance(command, Control):
                arrived = self._control(command) or arrived
            elif isinstance(command, Add) and (self._swap is not None or self.pause_mode is not None):
                self._held.append(command)  # runs on the new weights, or after /resume
            elif isinstance(command, Add):
                arrived = self._admit(command) or arrived
            elif command.request_id in self._sinks:  # its reader left (or timed out)
                self.engine.abort(command.request_id)
                # Its slot back now, not at the next step: none runs while paused in keep mode.
                self._deliver(self.engine.reap())
                self._report_batch()
            else:  # its reader left while it was held for a swap or a pause
                self._drop_held({command.request_id})

    def _control(self, command: Control) -> bool:
        """Apply /pause, /resume or /abort_requests; True if requests were admitted (a resume)."""
        if command.action == "resume":
            self.pause_mode = None
            admitted = self._admit_held() if self._swap is None else 0
            self._loop.call_soon_threadsafe(_settle, command.done, admitted)
            return admitted > 0
        if command.action == "pause":
            self.pause_mode = command.mode
        num_aborted = self._abort(command.request_ids) if command.action == "abort" or command.mode == "abort" else 0
        if command.action == "pause" and command.mode != "keep":
            self._pause_waiters.append((command.done, num_aborted))  # answered once idle
        else:
            self._loop.call_soon_threadsafe(_settle, command.done, num_aborted)
        return False

    def _abort(self, request_ids: frozenset[str] | None) -> int:
        """Abort the matching requests, held or in the engine; those in the engine are retired
        at once, so their replies end even while no step runs (paused in keep mode)."""
        def matches(request_id: str) -> bool:
            # A choice's id is its reply's id and "-index"; a Responses reply spells it "resp_<hex>".
            reply_id = request_id.rpartition("-")[0]
            return (request_ids is None or request_id in request_ids or reply_id in request_ids
                    or reply_id.replace("-", "_", 1) in request_ids)

        running = [request_id for request_id in self._sinks if matches(request_id)]
        for request_id in running:
            self.engine.abort(request_id)
        held = {command.request_id for command in self._held if matches(command.request_id)}
        self._drop_held(held, aborted=True)
        reaped = self.engine.reap()
        for out in reaped:  # a reply that ends with finish_reason "abort", not a timeout's 504
            out.error_code = ABORTED_BY_REQUEST
        self._deliver(reaped)
        self._report_batch()
        return len(running) + len(held)

    def _report_batch(self) -> None:
        """The busy period that just ended, if the engine went idle (a step, or aborts reaped
        between steps), to on_batch (the batch log)."""
        summary = self.engine.take_batch_summary()
        if summary is not None:
            self.on_batch(summary)

    def _drop_held(self, request_ids: set[str], aborted: bool = False) -> None:
        """Held requests that will never run: their reader left, or (aborted) they end with "abort"."""
        dropped = [held for held in self._held if held.request_id in request_ids]
        self._held = [held for held in self._held if held.request_id not in request_ids]
        self._num_taken += len(dropped)  # no longer waiting
        if aborted and dropped:
            version = self.engine.weight_version
            ended = [(held.sink, RequestOutput(held.request_id, "", [], len(held.prompt_ids), 0, finish_reason="abort",
                                               error_code=ABORTED_BY_REQUEST, weight_version=version))
                     for held in dropped]
            self._loop.call_soon_threadsafe(_put_all, ended)

    def _admit_held(self) -> int:
        held, self._held = self._held, []
        return sum(self._admit(command) for command in held)

    def _admit(self, command: Add) -> bool:
        """Hand a request to the engine (False: refused, its error delivered)."""
        self._num_taken += 1
        try:
            self.engine.add_request(command.request_id, command.prompt_ids, command.params)
        except ValueError as e:  # refused alone; the engine and the others go on
            failed = RequestOutput(command.request_id, "", [], len(command.prompt_ids), 0,
                                   finish_reason="error", error=f"the request was refused: {e}")
            self._loop.call_soon_threadsafe(_put_all, [(command.sink, failed)])
            return False
        self._sinks[command.request_id] = command.sink
        return True

    def _install_swap(self) -> None:
        """The engine is idle (or the swap keeps what runs): swap, answer load_weights, then
        admit the requests held meanwhile, unless paused."""
        swap, self._swap = self._swap, None
        keep = swap.keep or self.pause_mode == "keep"
        started = time.perf_counter()
        try:
            num_refilled = self.engine.install_weights(swap.prepared, swap.version, keep=keep)
        except Exception as e:  # a bug: load_weights fails, the old weights keep serving
            self._loop.call_soon_threadsafe(_settle, swap.done, e)
        else:
            result = (started - swap.queued_at, time.perf_counter() - started, "keep" if keep else "drain",
                      num_refilled)
            self._loop.call_soon_threadsafe(_settle, swap.done, result)
        if self.pause_mode is None:
            self._admit_held()

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
        waiting = {**self._sinks, **{held.request_id: held.sink for held in self._held}}
        ready = [(sink, RequestOutput(rid, "", [], 0, 0, finish_reason="error", error=message))
                 for rid, sink in waiting.items()]
        self._sinks.clear()
        self._held.clear()
        if self._swap is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(_settle, self._swap.done, RuntimeError(message))
        for done, _ in self._pause_waiters if self._loop is not None else []:
            self._loop.call_soon_threadsafe(_settle, done, RuntimeError(message))
        if ready and self._loop is not None:
            self._loop.call_soon_threadsafe(_put_all, ready)


def _put_all(ready: list[tuple[asyncio.Queue, RequestOutput]]) -> None:
    for sink, out in ready:
        sink.put_nowait(out)


def _settle(future: asyncio.Future, result: object) -> None:
    """A load_weights' answer (an exception is raised to it), unless its caller has gone."""
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
