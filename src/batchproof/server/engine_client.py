"""What the server needs of an engine, as two protocols: the server is written against
these, not the concrete Engine and AsyncEngine, so a fleet of replicas elsewhere
(batchproof.fleet) stands in behind the same routes. EngineClient is what a route asks of
the model (its facts as one `front`, the prompt a chat renders to, what shapes the
numbers); Backend runs requests, and says whether it can swap the weights in place."""

from pathlib import Path
from typing import Protocol

from batchproof.engine.async_engine import Opened, WeightSwap
from batchproof.engine.cache.prefix_cache import PrefixCache
from batchproof.engine.model_front import ModelFront
from batchproof.engine.sampling_params import SamplingParams


class EngineClient(Protocol):
    front: ModelFront  # the tokenizer, the chat format, the context length, the file
    prefix_cache: PrefixCache | None  # its counters and bytes go to /metrics; None when off

    def chat_prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The chat template rendered for a reply, tokenized as the model expects."""

    def info(self) -> dict:
        """Everything that shapes the numbers, for /v1/server_info."""


class Backend(Protocol):
    """Runs requests: AsyncEngine in one process, or a fleet's router to its replicas."""

    engine: EngineClient
    failure: BaseException | None  # set when no request can run any more (503s)
    num_faults: int  # steps that raised and failed only their own requests (/health: degraded)
    last_fault: str | None
    # Whether load_weights may be called: a local engine swaps its weights; a fleet's router
    # cannot (each replica holds its own), and /v1/load_weights answers a 501 before reading the body.
    supports_weight_updates: bool

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_free_slots(self) -> int: ...

    async def open(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> Opened:
        """Admit a request (an APIError if it cannot be: 429, 503) -> who runs it and its deltas."""

    async def load_weights(self, path: Path) -> WeightSwap:
        """Replace the weights in place (only where supports_weight_updates): requests admitted
        before finish on the old ones; a ModelLoadError leaves the old weights serving."""

    def stop(self) -> None: ...
