"""A model we cannot use, said in one line: the error, the typed reads of a format's keys that
raise it (GGUF metadata, config.json), and the line a user sees for each load error."""

import math
from pathlib import Path
from typing import Any

from batchproof.engine.model.default_model import DefaultModelMissing
from batchproof.engine.model.known_models import UnknownModel

MAX_SIZE = 2**31 - 1  # no real size or count comes near it


class ModelLoadError(Exception):
    """A model file we cannot use; the message is one line naming the file and the problem."""


class Metadata:
    """Typed reads of metadata values: a missing key, a wrong type or a value out of range is
    a ModelLoadError naming the key (a string where a count belongs must not reach int())."""

    kind = "metadata key"  # how a message names a key (a Hugging Face config.json says "key")

    def __init__(self, meta: dict[str, Any], path: Path) -> None:
        self.meta, self.path = meta, path

    def fail(self, message: str) -> ModelLoadError:
        return ModelLoadError(f"{self.path}: {message}")

    def _get(self, key: str, default: Any) -> Any:
        if key in self.meta:
            return self.meta[key]
        if default is None:
            raise self.fail(f"{self.kind} {key!r} is missing")
        return default

    def int(self, key: str, default: int | None = None, minimum: int = 1) -> int:
        value = self._get(key, default)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(f"{self.kind} {key!r} is {shown(value)}, not an integer")
        # The kernels take sizes as int64: a crafted 2**64 - 1 must not wrap around to -1 there.
        if not minimum <= value <= MAX_SIZE:
            raise self.fail(f"{self.kind} {key!r} is {value}; it must be {minimum} to {MAX_SIZE}")
        return value

    def float(self, key: str, default: float | None = None, is_positive: bool = True) -> float:
        value = self._get(key, default)
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            raise self.fail(f"{self.kind} {key!r} is {shown(value)}, not a finite number")
        if value < 0 or (is_positive and value == 0):
            raise self.fail(f"{self.kind} {key!r} is {value}; it must be {'above' if is_positive else 'at least'} 0")
        return float(value)


def shown(value: Any) -> str:
    """A value as a message may show it: a crafted string or array could be megabytes long."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def load_error_message(error: BaseException) -> str | None:
    """The line to print for a model that cannot be loaded, or None for a bug."""
    if isinstance(error, (ModelLoadError, DefaultModelMissing, UnknownModel)):
        return str(error)
    if isinstance(error, (PermissionError, IsADirectoryError)):
        return f"{error.filename}: {error.strerror}"
    return None
