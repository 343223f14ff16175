"""What the routes share: settings, the backend (once loaded), metrics; and body parsing."""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from batchproof.engine.config import EngineConfig
from batchproof.engine.model.front import ModelFront
from batchproof.server.batch_log import BatchLog
from batchproof.server.config import ServerConfig
from batchproof.server.engine_client import Backend, EngineClient
from batchproof.server.errors import APIError, from_validation_error
from batchproof.server.guards.owners import Owners
from batchproof.server.guards.precount import precount
from batchproof.server.metrics import Metrics
from batchproof.server.request.plan import Limits

Model = TypeVar("Model", bound=BaseModel)


@dataclass
class ServerState:
    config: ServerConfig
    engine_config: EngineConfig
    metrics: Metrics = field(default_factory=Metrics)
    backend: Backend | None = None  # once loaded (or connected, for a fleet): runs requests
    served_model_name: str = ""
    prefix_cache_scope: str = "shared"  # the config's, resolved: "key" by default when API keys are set
    api_key_required: bool = False
    load_error: str | None = None
    batch_log: BatchLog | None = None
    # Called (from the loader thread) when the model cannot load: `batchproof serve` stops the
    # server then and exits non-zero; an app built without it stays up answering 503.
    on_load_error: Callable[[], None] | None = None
    # Called (from the engine thread) when the engine stops for good: `batchproof serve` exits
    # non-zero then, so a supervisor restarts it; an app built without it answers 503.
    on_engine_failure: Callable[[], None] | None = None
    weights_root: Path | None = None  # load_weights reads only under it (resolved when the engine starts)
    owners: Owners = field(default_factory=Owners)  # who sent each request in flight (/abort_requests)

    @property
    def client(self) -> EngineClient:
        """What a route asks of the model; a 503 while it loads or after it failed to."""
        if self.load_error is not None:
            raise APIError(503, f"the model failed to load: {self.load_error}", type_="service_unavailable")
        if self.backend is None:
            raise APIError(503, "the model is still loading", type_="service_unavailable",
                           headers={"Retry-After": "1"})
        return self.backend.engine

    @property
    def model_name(self) -> str:
        """The served model's name, as a request's `model` is checked against it: a 503 while the
        model loads (without --served-model-name the name is the file's, unknown until then; a
        request naming it got a 404 saying this server serves '')."""
        _ = self.client
        return self.served_model_name

    @property
    def front(self) -> ModelFront:
        """The model's facts: tokenizer, chat format, context length (a 503 as `client`)."""
        return self.client.front

    @property
    def limits(self) -> Limits:
        return Limits(max_batch=self.engine_config.max_batch, max_choices=self.config.max_queue,
                      max_logprobs=self.config.max_logprobs, max_logprob_entries=self.config.max_logprob_entries,
                      logprobs_mode=self.config.logprobs_mode, max_logit_bias=self.config.max_logit_bias,
                      prefix_cache_scope=self.prefix_cache_scope)


def parse_body(model: type[Model], body: bytes) -> Model:
    precount(body, getattr(model, "counted_items", {}))
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        raise from_validation_error(e) from None
