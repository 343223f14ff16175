"""The board file: which servers to start or reach, what each serves, which configurations to probe.

A strict reader: an unknown key, a missing one or a value of the wrong kind is a BoardError naming
the key and the value, so `batchproof board` exits 2 before anything starts."""

import os
import reprlib
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from batchproof.probe.config import ProbeConfig
from batchproof.probe.wire.request import ROUTES

# A configuration's name -> the ProbeConfig flags it sets (the probe's own modes, one run each).
CONFIGURATIONS: dict[str, dict[str, bool]] = {
    "identical": {},
    "mixed": {"is_mixed": True},
    "cache": {"is_cache": True},
    "stream-parity": {"is_stream_parity": True},
    "fleet": {"is_fleet": True},  # N replicas behind one URL: each measured alone, and must agree
}
# The probe options a server's entry may set; the board fixes the rest (witness, matrix, identity).
PROBE_KEYS = ("extra_body", "route", "served_model", "timeout_s", "settle_s", "stagger_ms")
DEFAULT_READY_TIMEOUT_S = 300.0
DOCUMENT = "(the board)"
_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 80
_SHOWN.maxlist = _SHOWN.maxdict = 6


class BoardError(ValueError):
    """A board file that cannot be run, naming the key at fault and its value."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key


def shown(value: object) -> str:
    return _SHOWN.repr(value)


@dataclass(frozen=True)
class ServerSpec:
    """One server of the board: reached at `url`, or started by `command` (argv, placeholders in it)."""

    name: str
    configurations: tuple[str, ...]
    url: str | None = None
    command: tuple[str, ...] | None = None
    ready: str | None = None  # polled until it answers 200 (default: {url}/v1/models)
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    model: Path | None = None  # the file it serves: recorded by name and sha256
    probe: dict[str, Any] = field(default_factory=dict)
    commit: str | None = None  # $VARS expanded, as in paths
    binary: Path | None = None
    binary_sha256: str | None = None
    is_control: bool = False  # a negative control: every configuration must be NOT ADMISSIBLE
    builtin: str | None = None  # one the board ships (its drift control), neither reached nor started

    @property
    def is_ours(self) -> bool:
        """Started as `batchproof serve` (or `python -m batchproof serve`): it has --no-batch-invariant."""
        words = [Path(word).name for word in self.command or ()]
        return "serve" in words and any(word == "batchproof" for word in words[: words.index("serve")])


@dataclass(frozen=True)
class BoardSpec:
    servers: tuple[ServerSpec, ...]
    matrix: Path | None = None  # the probe's perf-matrix (default: the shipped one)
    contract: Path | None = None  # the check's contract (default: the shipped one)
    host: str | None = None  # the machine's name in every witness (default: its hostname)


def _child(where: str, key: object) -> str:
    name = key if isinstance(key, str) and key.isidentifier() else shown(key)
    return f"{where}.{name}" if where else str(name)


def _mapping(raw: object, where: str, required: tuple[str, ...], known: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise BoardError(where or DOCUMENT, f"must be a mapping, got {shown(raw)}")
    unknown = [key for key in raw if key not in known]
    if unknown:
        raise BoardError(_child(where, unknown[0]), f"is not a board key (known: {', '.join(known)})")
    missing = [key for key in required if key not in raw]
    if missing:
        raise BoardError(_child(where, missing[0]), "is missing")
    return raw


def _text(raw: dict[str, Any], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise BoardError(_child(where, key), f"must be a non-empty string, got {shown(value)}")
    return value


def _path(raw: dict[str, Any], key: str, where: str, base: Path) -> Path | None:
    # Paths are the board file's own: relative ones are read from its folder; $VARS are expanded.
    value = _text(raw, key, where)
    return None if value is None else base / os.path.expandvars(value)


def _command(value: object, where: str) -> tuple[str, ...]:
    """argv: a list of strings, or one string split as a shell would; $VARS expanded (an unset one
    stays as written, so the command fails to start and its row says so)."""
    words = shlex.split(value) if isinstance(value, str) else value
    if not isinstance(words, list) or not words or not all(isinstance(w, str | int | float) for w in words):
        raise BoardError(where, f"must be a command line (a string or a list of strings), got {shown(value)}")
    return tuple(os.path.expandvars(str(word)) for word in words)


def _probe_options(raw: object, where: str) -> dict[str, Any]:
    options = dict(_mapping(raw or {}, where, (), PROBE_KEYS))
    extra = options.get("extra_body")
    if extra is not None and not isinstance(extra, dict):
        raise BoardError(f"{where}.extra_body", f"must be a mapping of fields, got {shown(extra)}")
    route = options.get("route")
    if route is not None and route not in ROUTES:
        raise BoardError(f"{where}.route", f"{shown(route)} is not one of {', '.join(ROUTES)}")
    for key in ("timeout_s", "settle_s", "stagger_ms"):
        value = options.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
            raise BoardError(f"{where}.{key}", f"must be a number >= 0, got {shown(value)}")
    return options


def _configurations(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise BoardError(where, f"must list configurations ({', '.join(CONFIGURATIONS)}), got {shown(value)}")
    for name in value:
        if name not in CONFIGURATIONS:
            raise BoardError(where, f"{shown(name)} is not one of {', '.join(CONFIGURATIONS)}")
    if len(set(value)) != len(value):
        raise BoardError(where, f"lists a configuration twice: {shown(value)}")
    return tuple(value)


SERVER_KEYS = ("name", "url", "command", "ready", "ready_timeout_s", "model", "probe", "configurations",
               "commit", "binary", "binary_sha256", "control")


def server_spec(raw: object, where: str, base: Path) -> ServerSpec:
    fields = _mapping(raw, where, ("name", "configurations"), SERVER_KEYS)
    name = _text(fields, "name", where)
    url, command = _text(fields, "url", where), fields.get("command")
    if (url is None) == (command is None):
        raise BoardError(where, f"give `url` or `command`, exactly one (server {shown(name)})")
    timeout = fields.get("ready_timeout_s", DEFAULT_READY_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise BoardError(f"{where}.ready_timeout_s", f"must be a number > 0, got {shown(timeout)}")
    control = fields.get("control", False)
    if not isinstance(control, bool):
        raise BoardError(f"{where}.control", f"must be true or false, got {shown(control)}")
    spec = ServerSpec(
        name=name,
        configurations=_configurations(fields["configurations"], f"{where}.configurations"),
        url=url,
        command=None if command is None else _command(command, f"{where}.command"),
        ready=_text(fields, "ready", where),
        ready_timeout_s=float(timeout),
        model=_path(fields, "model", where, base),
        probe=_probe_options(fields.get("probe"), f"{where}.probe"),
        commit=os.path.expandvars(_text(fields, "commit", where) or "") or None,
        binary=_path(fields, "binary", where, base),
        binary_sha256=_text(fields, "binary_sha256", where),
        is_control=control,
    )
    _check_probe_accepts(spec, where)
    return spec


def _check_probe_accepts(spec: ServerSpec, where: str) -> None:
    """Every configuration's probe settings, as the probe will be given them, checked now: a value it
    refuses stops the board before anything starts, not halfway through."""
    for configuration in spec.configurations:
        try:
            ProbeConfig(url=spec.url or "http://127.0.0.1", **CONFIGURATIONS[configuration], **spec.probe)
        except ValueError as error:
            key = "url" if spec.url is not None and "--url" in str(error) else "probe"
            raise BoardError(f"{where}.{key}", f"{error} (configuration {configuration})") from None


def board_from_mapping(raw: object, base: Path) -> BoardSpec:
    fields = _mapping(raw, "", ("servers",), ("servers", "matrix", "contract", "host"))
    servers = fields["servers"]
    if not isinstance(servers, list) or not servers:
        raise BoardError("servers", f"must list at least one server, got {shown(servers)}")
    specs = tuple(server_spec(entry, f"servers[{i}]", base) for i, entry in enumerate(servers))
    names = [spec.name for spec in specs]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise BoardError("servers", f"names {shown(twice)} twice; each server needs its own name")
    return BoardSpec(specs, _path(fields, "matrix", "", base), _path(fields, "contract", "", base),
                     _text(fields, "host", ""))


def load_board(path: Path) -> BoardSpec:
    """The board at `path`; BoardError for anything but a well-formed board, OSError for an unreadable file."""
    try:
        raw = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = "" if mark is None else f" (line {mark.line + 1}, column {mark.column + 1})"
        raise BoardError(DOCUMENT, f"is not YAML{where}") from None
    except UnicodeDecodeError as error:
        raise BoardError(DOCUMENT, f"is not UTF-8 text ({error.reason})") from None
    return board_from_mapping(raw, path.absolute().parent)
