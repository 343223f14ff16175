"""Where a model's weights come from, chosen once by the path: a directory is a Hugging Face
checkpoint (hf_checkpoint.py), anything else a GGUF file (gguf_file.py)."""

import contextlib
import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from batchproof.common.hashing import file_sha256
from batchproof.engine.model.gguf_file import GGUF_MAGIC, ModelFile, ModelLoadError, read_model_file
from batchproof.engine.model.hf_checkpoint import (
    CONFIG_FILE,
    INDEX_FILE,
    checkpoint_sha256,
    read_checkpoint,
    safetensors_files,
)

HASH_BLOCK_BYTES = 1 << 20


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


def hashed_files(path: Path, check: Callable[[Path], None] = lambda file: None) -> list[Path]:
    """The files model_sha256 hashes: the GGUF, or config.json and the safetensors files. `check`
    sees each file before anything opens it (and the safetensors index before it is read)."""
    path = Path(path)
    if not is_checkpoint_dir(path):
        check(path)
        return [path]
    check(path / CONFIG_FILE)
    if os.path.lexists(path / INDEX_FILE):
        check(path / INDEX_FILE)
    shards = safetensors_files(path)
    for shard in shards:
        check(shard)
    return [path / CONFIG_FILE, *shards]


@contextlib.contextmanager
def pinned_files(path: Path) -> Iterator[Callable[[], str]]:
    """Opens each file model_sha256 hashes once (a regular file, else OSError or ModelLoadError)
    and yields what hashes them through those same descriptors: call it once the model is read
    and built, and the sha256 names the bytes loaded. A file renamed over or rewritten
    meanwhile is a ModelLoadError then, never a sha256 of other bytes; and nothing is hashed
    before read_model's checks have passed (a file that is not a model is never read whole)."""
    path = Path(path)
    files = hashed_files(path)
    opened: list[tuple[int, os.stat_result]] = []
    try:
        for file in files:
            fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a FIFO must not block the open
            opened.append((fd, os.fstat(fd)))
            if not stat.S_ISREG(opened[-1][1].st_mode):
                raise ModelLoadError(f"{file}: not a regular file")
        if not is_checkpoint_dir(path) and os.pread(opened[0][0], len(GGUF_MAGIC), 0) != GGUF_MAGIC:
            # Said without the bytes it starts with: the file may be anything on the machine.
            raise ModelLoadError(f"{path}: neither a GGUF file nor a checkpoint directory")

        def sha256() -> str:
            digests = [_fd_sha256(fd) for fd, _ in opened]
            for file, (fd, before) in zip(files, opened):
                if not _same_file(before, os.fstat(fd), os.stat(file)):
                    raise ModelLoadError(f"{file}: changed while it was read; load it again once it is written")
            if not is_checkpoint_dir(path):
                return digests[0]
            lines = "".join(f"{file.name}\0{digest}\n" for file, digest in zip(files, digests))  # as checkpoint_sha256
            return hashlib.sha256(lines.encode()).hexdigest()

        yield sha256
    finally:
        for fd, _ in opened:
            os.close(fd)


def _fd_sha256(fd: int) -> str:
    digest, offset = hashlib.sha256(), 0
    while block := os.pread(fd, HASH_BLOCK_BYTES, offset):
        digest.update(block)
        offset += len(block)
    return digest.hexdigest()


def _same_file(opened: os.stat_result, now: os.stat_result, named: os.stat_result) -> bool:
    """The name still leads to the file opened, and that file was not written since."""
    return ((named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)
            and (now.st_size, now.st_mtime_ns) == (opened.st_size, opened.st_mtime_ns))
