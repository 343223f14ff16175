"""Where a model's weights come from, chosen once by the path: a directory is a Hugging Face
checkpoint (hf_checkpoint.py), anything else a GGUF file (gguf_file.py)."""

from collections.abc import Callable
from pathlib import Path

from batchproof.common.hashing import file_sha256
from batchproof.engine.model.gguf_file import ModelFile, read_model_file
from batchproof.engine.model.hf_checkpoint import checkpoint_sha256, read_checkpoint


def is_checkpoint_dir(path: Path) -> bool:
    return Path(path).is_dir()


def read_model(path: Path, runs_natively: Callable[[int], bool] | None = None) -> ModelFile:
    """The spec, metadata and tensors, checked, from either format (ModelLoadError: one line)."""
    if is_checkpoint_dir(path):
        return read_checkpoint(path, runs_natively)
    return read_model_file(path, runs_natively)


def model_sha256(path: Path) -> str:
    """The GGUF's sha256, or the checkpoint's (config.json and every safetensors file, by content)."""
    return checkpoint_sha256(path) if is_checkpoint_dir(path) else file_sha256(path)
