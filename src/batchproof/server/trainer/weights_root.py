"""Where load_weights may read: a path resolved under --weights-root to a GGUF or a checkpoint
directory whose every file read is a regular file under the root (no device, FIFO or socket,
no symlink or `..` leading out)."""

import os
import stat
from pathlib import Path

from batchproof.engine.model.errors import ModelLoadError
from batchproof.engine.model.source import model_source
from batchproof.server.errors import APIError, shown

# One answer for a path outside the root, missing, unreadable or not a regular file: what the
# file system holds outside a model is none of a client's business (no probing for files).
NOT_LOADABLE = "not a loadable checkpoint under --weights-root"


def not_loadable(given: str) -> APIError:
    return APIError(400, f"'path' {shown(given)} is {NOT_LOADABLE}", param="path")


def weights_path(root: Path, given: str) -> Path:
    """`given` (absolute, or relative to `root`) with every symlink resolved, once each file a
    load would open is a regular file under `root`; else a 400 that says nothing more."""
    if "\0" in given:
        raise not_loadable(given)
    resolved = Path(os.path.realpath(root / given))  # an absolute `given` replaces the root

    def check(file: Path) -> None:
        real = Path(os.path.realpath(file))
        if not real.is_relative_to(root) or not stat.S_ISREG(os.stat(real).st_mode):
            raise not_loadable(given)

    if not resolved.is_relative_to(root):
        raise not_loadable(given)
    try:
        model_source(resolved).hashed_files(check)
    except (OSError, ValueError):
        raise not_loadable(given) from None
    except ModelLoadError:  # a directory, under the root, that is laid out wrong: the loader says how
        pass
    return resolved
