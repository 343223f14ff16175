"""The HTTP front end's settings: how it listens, admits and logs."""

from dataclasses import dataclass, field
from pathlib import Path

from batchproof.common.config import require


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
        require(0 <= self.port <= 65535, f"port must be 0..65535, got {self.port}")
        require(self.max_queue >= 1, f"max_queue must be >= 1, got {self.max_queue}")
        require(self.request_timeout_s > 0, f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        require(
            self.served_model_name is None or self.served_model_name.strip() != "",
            "served_model_name must not be blank",
        )
