"""One-line messages for the errors a user can cause when loading a model."""

from batchproof.engine.model.default_model import DefaultModelMissing
from batchproof.engine.model.gguf_file import ModelLoadError
from batchproof.engine.model.known_models import UnknownModel


def load_error_message(error: BaseException) -> str | None:
    """The line to print for a model that cannot be loaded, or None for a bug."""
    if isinstance(error, (ModelLoadError, DefaultModelMissing, UnknownModel)):
        return str(error)
    if isinstance(error, (PermissionError, IsADirectoryError)):
        return f"{error.filename}: {error.strerror}"
    return None
