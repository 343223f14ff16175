"""What the asyncio side puts in the engine thread's inbox (requests, aborts, weight swaps, the
control plane's commands), and what a weight swap reports."""

import asyncio
import time
from dataclasses import dataclass, field
from typing import Literal

from batchproof.engine.engine import PreparedWeights
from batchproof.engine.sampling.params import SamplingParams


@dataclass
class Add:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    sink: asyncio.Queue


@dataclass
class Abort:
    request_id: str


# vLLM's /pause modes: end the requests in flight (finish_reason "abort"), let them finish and
# admit none, or hold them where they are until /resume.
PauseMode = Literal["abort", "wait", "keep"]
# The error_code of a request ended by /abort_requests or /pause?mode=abort: its reply ends
# normally, with finish_reason "abort" (any other abort is the server's timeout: a 504).
ABORTED_BY_REQUEST = "aborted_by_request"


@dataclass
class Swap:
    """Install new weights once the requests admitted before this command have finished or,
    with `keep` (or while paused in keep mode), at the next step boundary, every running
    sequence then feeding its prefix again under the new weights."""

    prepared: PreparedWeights
    version: str | None
    keep: bool
    done: asyncio.Future
    queued_at: float = field(default_factory=time.perf_counter)


@dataclass
class Control:
    """/pause, /resume or /abort_requests, applied on the engine thread between two steps."""

    action: Literal["pause", "resume", "abort"]
    done: asyncio.Future
    mode: PauseMode = "abort"
    request_ids: frozenset[str] | None = None  # abort: these requests (a reply's id or a choice's); None: all


@dataclass(frozen=True)
class WeightSwap:
    """What a load_weights took: reading and building the new weights (requests kept running),
    then the wait for the requests admitted before it to finish (none in keep mode: they feed
    their prefixes again after it), then the swap itself."""

    load_s: float
    drain_s: float
    swap_s: float
    mode: Literal["drain", "keep"] = "drain"
    num_refilled: int = 0  # keep mode: the sequences that compute their prefix again
