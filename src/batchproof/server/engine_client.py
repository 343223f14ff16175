"""What the server needs of an engine, as three protocols: the server is written against
these, not the concrete Engine and AsyncEngine, so a fleet of replicas elsewhere
(batchproof.fleet) stands in behind the same routes. EngineClient is what a route asks of
the model (its facts as one `front`, the prompt a chat renders to, what shapes the
numbers); Backend runs requests; WeightControl, a Backend's `control`, swaps the weights in
place and pauses, resumes and aborts (the trainer's routes, trainer/): the local engine has
one, a fleet's router has none (None: those routes answer 501)."""

from pathlib import Path
from typing import Protocol

from batchproof.engine.async_engine import Opened, PauseMode, WeightSwap
from batchproof.engine.cache.prefix_cache import PrefixCache
from batchproof.engine.model.front import ModelFront
from batchproof.engine.sampling.params import SamplingParams


class EngineClient(Protocol):
    front: ModelFront  # the tokenizer, the chat format, the context length, the file
    prefix_cache: PrefixCache | None  # its counters and bytes go to /metrics; None when off

    def chat_prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The chat template rendered for a reply, tokenized as the model expects."""

    def info(self) -> dict:
        """Everything that shapes the numbers, for /v1/server_info."""


class WeightControl(Protocol):
    """The control plane of one engine, vLLM's names (docs/weight-versions.md): the weights
    swapped in place, admission paused and resumed, requests aborted."""

    is_paused: bool
    pause_mode: PauseMode | None

    async def load_weights(self, path: Path, version: str | None = None, keep: bool = False) -> WeightSwap:
        """Replace the weights in place, labelled `version`: requests admitted before finish on
        the old ones, or with `keep` (or while paused in keep mode) go on under the new ones; a
        ModelLoadError leaves the old weights serving."""

    async def pause(self, mode: PauseMode) -> int:
        """Stop admitting; abort, finish or hold what is in flight -> how many were aborted."""

    async def resume(self) -> int:
        """Step and admit again -> how many held requests were admitted."""

    async def abort_requests(self, request_ids: list[str] | None) -> int:
        """End these requests (None: all) with finish_reason "abort" -> how many."""

    def weight_info(self) -> dict:
        """The weight version served now, its model's sha256, path and load time."""


class Backend(Protocol):
    """Runs requests: one engine in this process (app.py's LocalBackend, an AsyncEngine), or a
    fleet's router to its replicas."""

    engine: EngineClient
    failure: BaseException | None  # set when no request can run any more (503s)
    num_faults: int  # steps that raised and failed only their own requests (/health: degraded)
    last_fault: str | None
    # The weights swapped in place and the control plane (load_weights, pause, resume,
    # abort_requests, weight_info): the local engine's own; None for a fleet's router (each
    # replica holds its own weights and queue), whose routes answer a 501 before reading the body.
    control: WeightControl | None

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_free_slots(self) -> int: ...

    async def open(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> Opened:
        """Admit a request (an APIError if it cannot be: 429, 503) -> who runs it and its deltas."""

    def stop(self) -> None: ...
