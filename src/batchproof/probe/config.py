"""The probe's settings, checked once when they are made."""

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from batchproof.probe.mode import Mode
from batchproof.probe.prompts import BUILTIN_PROMPTS, load_prompts
from batchproof.probe.wire.request import ROUTES, Route

DEFAULT_PROMPT = "Write an essay on compilers."
# The key kept out of `ps` and shell history, read by `batchproof serve` too. Not OPENAI_API_KEY:
# the probe measures any server, and a key meant for OpenAI must not be sent to whatever --url says.
API_KEY_ENV = "BATCHPROOF_API_KEY"
# What every request asks, fixed by the spec and the matrix: --extra-body may add fields, not change these.
PROTOCOL_FIELDS = frozenset({"messages", "prompt", "logprobs", "top_logprobs", "temperature", "max_tokens",
                             "seed", "ignore_eos", "stream", "stream_options", "model", "input", "include",
                             "max_output_tokens"})


def _flag(flag: str, help: str, metavar: str | None = None, parse: Any = str) -> dict[str, Any]:
    """How a field appears on the command line (the CLI is built from these)."""
    return {"flag": flag, "help": help, "metavar": metavar, "parse": parse}


def parse_extra_body(text: str) -> dict[str, Any]:
    """`--extra-body`: a JSON object of fields added to every request."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON ({err.msg})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object")
    return value


def parse_ladder(text: str) -> tuple[int, ...]:
    """`1,4,8,16` as integers; their values are checked with the matrix (exit 4)."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


@dataclass(frozen=True)
class ProbeConfig:
    url: str = field(metadata=_flag("--url", "the server's base URL, e.g. http://127.0.0.1:8080", "URL"))
    prompt: str = field(
        default=DEFAULT_PROMPT,
        metadata=_flag("--prompt", f"the user message (default: {DEFAULT_PROMPT!r})", "TEXT"),
    )
    ladder: tuple[int, ...] | None = field(
        default=None,
        metadata=_flag("--ladder", "concurrencies to fire (replaces the matrix's)", "1,4,8,16", parse_ladder),
    )
    server_log: Path | None = field(
        default=None,
        metadata=_flag("--server-log", "the server's log, read for `batch m=N done` lines", "FILE", Path),
    )
    witness: Path | None = field(
        default=None, metadata=_flag("--witness", "write the JSON witness here", "OUT.json", Path)
    )
    matrix: Path | None = field(
        default=None,
        metadata=_flag("--matrix", "a perf-matrix.yaml to use instead of the shipped one", "FILE", Path),
    )
    model_file: Path | None = field(
        default=None,
        metadata=_flag("--model-file", "the served GGUF: recorded by name and sha256", "GGUF", Path),
    )
    is_mixed: bool = field(
        default=False,
        metadata=_flag("--mixed", "fire c different prompts per band, each judged against its own m=1 "
                       "reference (default: c identical requests)", parse=bool),
    )
    prompts: Path | None = field(
        default=None,
        metadata=_flag("--prompts", "with --mixed: prompts to use, one a line (text, or JSONL: a string or "
                       "{\"prompt\": ...}); default: a built-in set of 16", "FILE", Path),
    )
    is_fleet: bool = field(
        default=False,
        metadata=_flag("--fleet", "the server is a fleet of replicas: measure each replica alone, record which "
                       "replica served every request (x-batchproof-replica), and fail when two replicas' "
                       "replies differ", parse=bool),
    )
    is_cache: bool = field(
        default=False,
        metadata=_flag("--cache", "also measure caches: per prompt, a cold run (a fresh nonce first) and warm "
                       "runs after requests sharing a long prefix (a system prompt, an earlier turn, prefixes cut "
                       "at several lengths), alone and in bands, each compared with the cold run", parse=bool),
    )
    is_stream_parity: bool = field(
        default=False,
        metadata=_flag("--stream-parity", "also fetch every reference and band slot whole (stream: false) and "
                       "compare its tokens, text and logprobs with the streamed reply's", parse=bool),
    )
    extra_body: dict[str, Any] | None = field(
        default=None,
        metadata=_flag("--extra-body", "a JSON object of fields added to every request, e.g. "
                       "'{\"cache_prompt\": false}' for llama-server", "JSON", parse_extra_body),
    )
    stagger_ms: float = field(
        default=0.0,
        metadata=_flag("--stagger-ms", "start slot i of a band i*MS ms after slot 0, so later ones join "
                       "a running batch (default 0)", "MS", float),
    )
    route: Route = field(
        default="chat",
        metadata=_flag("--route", "chat (/v1/chat/completions), completions (/v1/completions) or "
                       "responses (/v1/responses); default chat", "ROUTE"),
    )
    binary: Path | None = field(
        default=None,
        metadata=_flag("--binary", "the server's executable or package: recorded by sha256", "FILE", Path),
    )
    binary_sha256: str | None = field(
        default=None,
        metadata=_flag("--binary-sha256", "the server build's sha256, when no one file is the server "
                       "(batchproof reports it as build_sha256)", "HEX"),
    )
    served_model: str | None = field(
        default=None,
        metadata=_flag("--served-model", "the `model` to send (default: the first of /v1/models)", "NAME"),
    )
    host: str | None = field(default=None, metadata=_flag("--host", "the host that served", "H"))
    commit: str | None = field(default=None, metadata=_flag("--commit", "the commit that served", "C"))
    api_key: str | None = field(
        default=None, repr=False,  # a secret: never in a printed config
        metadata=_flag("--api-key", f"sent as `Authorization: Bearer KEY` (default: ${API_KEY_ENV}, which keeps "
                       "it out of `ps` and shell history)", "KEY"),
    )
    timeout_s: float = field(
        default=600.0, metadata=_flag("--timeout", "seconds one request may take (default 600)", "S", float)
    )
    # A batch is recorded when it finishes, which may trail its last stream by a few ms.
    settle_s: float = field(
        default=2.0,
        metadata=_flag("--settle", "seconds a band waits for its batch record (default 2)", "S", float),
    )
    poll_s: float = 0.05  # how often /slots, /metrics and the log are read
    # What --mixed and --fleet choose, chosen once: the run asks it instead of the flags.
    mode: Mode = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            url = httpx.URL(self.url)
        except (httpx.InvalidURL, TypeError) as err:
            raise ValueError(f"--url {self.url!r} is not a URL ({err})") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"--url {self.url!r} must be an http:// or https:// URL with a host")
        # Users of OpenAI clients often give the base URL with /v1; the routes add it.
        base = self.url.rstrip("/").removesuffix("/v1").rstrip("/")
        object.__setattr__(self, "url", base)
        if not self.prompt.strip():
            raise ValueError("--prompt must not be empty")
        if self.route not in ROUTES:
            raise ValueError(f"--route {self.route!r} must be one of: {', '.join(ROUTES)}")
        if not self.stagger_ms >= 0 or self.stagger_ms == float("inf"):
            raise ValueError(f"--stagger-ms must be a finite number >= 0, got {self.stagger_ms}")
        if self.prompts is not None and not self.is_mixed:
            raise ValueError("--prompts is for --mixed; give --prompt TEXT for identical requests")
        if self.is_mixed and self.prompt != DEFAULT_PROMPT:
            raise ValueError("--prompt is for identical requests; give --mixed --prompts FILE instead")
        if self.is_fleet and (self.is_cache or self.is_stream_parity):
            raise ValueError("--cache and --stream-parity measure one server; give them without --fleet")
        object.__setattr__(self, "mode", Mode.chosen(self.is_mixed, self.is_fleet))
        protected = sorted(set(self.extra_body or {}) & PROTOCOL_FIELDS)
        if protected:
            raise ValueError(f"--extra-body must not set {protected[0]!r}: the matrix and the probe decide it")
        if not self.timeout_s > 0:
            raise ValueError(f"--timeout must be positive, got {self.timeout_s}")
        if not self.settle_s >= 0:
            raise ValueError(f"--settle must not be negative, got {self.settle_s}")
        if not self.poll_s > 0:
            raise ValueError(f"poll interval must be positive, got {self.poll_s}")
        # A blank identity is an unknown one: it is recorded as null, never as "".
        for name in ("served_model", "host", "commit", "api_key", "binary_sha256"):
            value = getattr(self, name)
            if value is not None and not value.strip():
                object.__setattr__(self, name, None)

        if self.binary_sha256 is not None:
            if self.binary is not None:
                raise ValueError("give --binary or --binary-sha256, not both")
            digest = self.binary_sha256.strip().lower()
            if len(digest) != 64 or any(ch not in "0123456789abcdef" for ch in digest):
                raise ValueError(f"--binary-sha256 {self.binary_sha256!r} is not 64 hex digits")
            object.__setattr__(self, "binary_sha256", digest)

    def file_problem(self) -> str | None:
        """The first given path that is not usable, or None; checked before any request."""
        for flag, path in (
            ("--server-log", self.server_log),
            ("--prompts", self.prompts),
            ("--model-file", self.model_file),
            ("--binary", self.binary),
        ):
            if path is not None and not path.is_file():
                what = "not a file" if path.exists() else "no such file"
                return f"{flag} {path}: {what}"
        if self.witness is not None:
            if self.witness.is_dir():
                return f"--witness {self.witness}: is a directory"
            if not self.witness.absolute().parent.is_dir():
                return f"--witness {self.witness}: its directory does not exist"
        return None


    def prompt_set(self) -> tuple[str, ...]:
        """The prompts the run fires: one (identical), or the mixed set; PromptsError if unusable."""
        if not self.is_mixed:
            return (self.prompt,)
        return BUILTIN_PROMPTS if self.prompts is None else load_prompts(self.prompts)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One option per ProbeConfig field that has a flag."""
    for f in dataclasses.fields(ProbeConfig):
        if "flag" not in f.metadata:
            continue
        meta = f.metadata
        default = None if f.default is dataclasses.MISSING else f.default
        if meta["parse"] is bool:
            parser.add_argument(meta["flag"], dest=f.name, action="store_true", help=meta["help"])
            continue
        parser.add_argument(
            meta["flag"],
            dest=f.name,
            type=meta["parse"],
            metavar=meta["metavar"],
            help=meta["help"],
            default=default,
            required=f.default is dataclasses.MISSING,
        )


def config_from_args(args: argparse.Namespace) -> ProbeConfig:
    """The config from parsed options; raises ValueError for a bad value."""
    names = [f.name for f in dataclasses.fields(ProbeConfig) if "flag" in f.metadata]
    values = {name: getattr(args, name) for name in names}
    if values["api_key"] is None:  # read here, at the command line's edge: the config takes a value
        values["api_key"] = os.environ.get(API_KEY_ENV)
    return ProbeConfig(**values)
