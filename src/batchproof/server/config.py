"""The HTTP front end's settings: how it listens, admits and logs."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from batchproof.common.config import require


@dataclass(frozen=True)
class ServerConfig:
    """How the HTTP front end listens, admits and logs."""

    host: str = field(default="127.0.0.1", metadata={"help": "address to bind"})
    port: int = field(default=8080, metadata={"help": "port to bind (0 picks a free one)"})
    served_model_name: str | None = field(
        default=None, metadata={"help": "model id clients send (default: the GGUF file stem)"}
    )
    api_key: str | None = field(
        default=None, metadata={"help": "require 'Authorization: Bearer KEY' (or set $BATCHPROOF_API_KEY, which "
                                        "stays out of ps)"}
    )
    api_key_file: Path | None = field(
        default=None, metadata={"help": "accept the keys in this file, one per line (each its own prefix-cache "
                                        "namespace under --prefix-cache-scope key)"}
    )
    admin_api_key: str | None = field(
        default=None, metadata={"help": "the one key that may pause, resume, abort anyone's requests and load "
                                        "weights (tenant keys may abort only their own); it also serves as a "
                                        "tenant of its own (or set $BATCHPROOF_ADMIN_API_KEY, which stays out of ps)"}
    )
    admin_api_key_file: Path | None = field(
        default=None, metadata={"help": "read the admin key from this file (one key)"}
    )
    prefix_cache_scope: Literal["shared", "key", "salt"] | None = field(
        default=None, metadata={"help": "who may reuse whose cached prefixes: shared (everyone; a request's "
                                        "cache_salt still separates), key (each API key apart), salt (only requests "
                                        "with the same cache_salt) [default: key with API keys, else shared]"}
    )
    max_request_mb: float = field(
        default=8.0, metadata={"help": "largest request body read, in MiB (larger: 413 before reading it)"}
    )
    log_file: Path | None = field(default=None, metadata={"help": "also append batch log lines here"})
    max_queue: int = field(default=256, metadata={"help": "waiting requests accepted before 429"})
    request_timeout_s: float = field(
        default=600.0, metadata={"help": "abort a request that runs longer than this"}
    )
    max_logprobs: int = field(
        default=20, metadata={"help": "most alternatives per token in top_logprobs, logprobs and prompt_logprobs"}
    )
    max_logprob_entries: int = field(
        default=100_000,
        metadata={"help": "most logprob entries one response may carry (counted at the worst case, tokens x "
                          "(1 + alternatives)); bounds a reply near 5 MB"},
    )
    max_logit_bias: int = field(
        default=1024, metadata={"help": "most entries one request's logit_bias may hold (each is one token id)"}
    )
    allow_weight_updates: bool = field(
        default=False,
        metadata={"help": "serve POST /v1/load_weights: a checkpoint directory on this machine, of the served "
                          "model's architecture and shapes, replaces the weights in place (docs/hf-checkpoints.md); "
                          "with /pause, /resume and /abort_requests: needs --admin-api-key"},
    )
    weights_root: Path | None = field(
        default=None,
        metadata={"help": "the only directory load_weights reads under (symlinks resolved; regular files only) "
                          "[default: the directory holding the served model]"},
    )
    allowed_hosts: str | None = field(
        default=None,
        metadata={"help": "without an API key, the Host names accepted besides localhost, 127.0.0.1, [::1] and "
                          "--host (comma-separated; '*' accepts any): a guard against DNS rebinding"},
    )
    max_concurrent_requests: int = field(
        default=512, metadata={"help": "requests in flight (streams included; /health and /metrics aside) past "
                                       "which a new request gets 503 at once; idle connections are not counted "
                                       "(they close after 5 s without a request head)"}
    )
    receipts: Literal["on_request", "always"] = field(
        default="on_request",
        metadata={"help": "receipts (docs/receipts.md): on_request (a request's `receipt: true`) or always (on "
                          "every reply, whatever the request says)"},
    )
    logprobs_mode: Literal["raw", "processed"] = field(
        default="raw",
        metadata={"help": "default logprobs: raw (after penalties, before temperature and truncation) or "
                          "processed (the distribution sampled from)"},
    )

    @property
    def max_request_bytes(self) -> int:
        return int(self.max_request_mb * 2**20)

    def __post_init__(self) -> None:
        require(0 <= self.port <= 65535, f"port must be 0..65535, got {self.port}")
        require(self.max_request_mb > 0, f"max_request_mb must be > 0, got {self.max_request_mb}")
        require(self.prefix_cache_scope in (None, "shared", "key", "salt"),
                f"prefix_cache_scope must be shared, key or salt, got {self.prefix_cache_scope!r}")
        require(self.max_queue >= 1, f"max_queue must be >= 1, got {self.max_queue}")
        require(self.max_logprobs >= 0, f"max_logprobs must be >= 0, got {self.max_logprobs}")
        require(self.max_logprob_entries >= 1, f"max_logprob_entries must be >= 1, got {self.max_logprob_entries}")
        require(self.max_logit_bias >= 0, f"max_logit_bias must be >= 0, got {self.max_logit_bias}")
        require(self.receipts in ("on_request", "always"),
                f"receipts must be on_request or always, got {self.receipts!r}")
        require(self.logprobs_mode in ("raw", "processed"),
                f"logprobs_mode must be raw or processed, got {self.logprobs_mode!r}")
        require(self.weights_root is None or self.weights_root.is_dir(),
                f"weights_root {self.weights_root} is not a directory")
        require(self.max_concurrent_requests >= 1,
                f"max_concurrent_requests must be >= 1, got {self.max_concurrent_requests}")
        require(self.allowed_hosts is None or self.allowed_hosts.strip() != "", "allowed_hosts must not be blank")
        require(self.request_timeout_s > 0, f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        require(
            self.served_model_name is None or self.served_model_name.strip() != "",
            "served_model_name must not be blank",
        )
