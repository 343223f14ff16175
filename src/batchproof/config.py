"""Settings, one dataclass per concern, each checked when it is made; no torch here."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal


class ConfigError(ValueError):
    """A setting that cannot work; the message names the setting and its value."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class EngineConfig:
    """What shapes the numbers: the model, the device, the batch and its invariance."""

    model_path: Path | None = field(
        default=None, metadata={"help": "GGUF file to serve (default: the packaged SmolLM2-135M-Instruct)"}
    )
    device: str = field(default="auto", metadata={"help": "cpu, cuda, cuda:N or auto"})
    dtype: Literal["float32", "bfloat16", "float16"] = field(
        default="float32", metadata={"help": "compute dtype of weights and activations"}
    )
    max_batch: int = field(default=16, metadata={"help": "most sequences decoded together"})
    batch_window_ms: float = field(
        default=20.0, metadata={"help": "how long an idle engine waits for more arrivals before it starts"}
    )
    max_model_len: int | None = field(
        default=None, metadata={"help": "context per sequence (default: the model's, at most 8192)"}
    )
    is_batch_invariant: bool = field(
        default=True,
        metadata={"help": "bitwise the same tokens and logprobs at any batch size (off: faster torch path)"},
    )
    num_threads: int | None = field(default=None, metadata={"help": "CPU threads (default: all cores)"})
    max_prefill_tokens: int = field(
        default=2048, metadata={"help": "prompt tokens prefilled in one step before decoding resumes"}
    )

    def __post_init__(self) -> None:
        _require(self.max_batch >= 1, f"max_batch must be >= 1, got {self.max_batch}")
        _require(self.batch_window_ms >= 0, f"batch_window_ms must be >= 0, got {self.batch_window_ms}")
        _require(
            self.max_model_len is None or self.max_model_len >= 16,
            f"max_model_len must be >= 16, got {self.max_model_len}",
        )
        _require(
            self.num_threads is None or self.num_threads >= 1,
            f"num_threads must be >= 1, got {self.num_threads}",
        )
        _require(self.max_prefill_tokens >= 1, f"max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}")
        _require(
            self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"),
            f"device must be cpu, cuda, cuda:N or auto, got {self.device!r}",
        )


@dataclass(frozen=True)
class ServerConfig:
    """How the HTTP front end listens, admits and logs."""

    host: str = field(default="127.0.0.1", metadata={"help": "address to bind"})
    port: int = field(default=8080, metadata={"help": "port to bind (0 picks a free one)"})
    served_model_name: str | None = field(
        default=None, metadata={"help": "model id clients send (default: the GGUF file stem)"}
    )
    api_key: str | None = field(default=None, metadata={"help": "require 'Authorization: Bearer KEY'"})
    log_file: Path | None = field(default=None, metadata={"help": "also append batch log lines here"})
    max_queue: int = field(default=256, metadata={"help": "waiting requests accepted before 429"})
    request_timeout_s: float = field(
        default=600.0, metadata={"help": "abort a request that runs longer than this"}
    )

    def __post_init__(self) -> None:
        _require(0 <= self.port <= 65535, f"port must be 0..65535, got {self.port}")
        _require(self.max_queue >= 1, f"max_queue must be >= 1, got {self.max_queue}")
        _require(self.request_timeout_s > 0, f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        _require(
            self.served_model_name is None or self.served_model_name.strip() != "",
            "served_model_name must not be blank",
        )
