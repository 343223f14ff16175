"""Where a model's weights come from, decided once from the path, as vLLM's get_model_loader
decides: a directory is a Hugging Face checkpoint (hf/source.py), anything else a GGUF file
(gguf/source.py). Nothing else asks which format a path is: the engine, its front and
load_weights ask the source they got."""

import contextlib
import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from batchproof.engine.model.errors import ModelLoadError
from batchproof.engine.model.gguf.source import GGUFSource
from batchproof.engine.model.hf.source import CheckpointSource
from batchproof.engine.model.spec import ModelFile, ModelText

HASH_BLOCK_BYTES = 1 << 20


class ModelSource(Protocol):
    path: Path

    def read(self, runs_natively: Callable[[int], bool] | None = None) -> ModelFile:
        """The spec, metadata and tensors, checked (ModelLoadError: one line). runs_natively:
        keep the matmul weights whose type it accepts in their blocks; None dequantizes all."""

    def text(self, model_file: ModelFile | None = None) -> ModelText:
        """The tokenizer, chat template and context length: from `model_file` as read, or (None)
        from the headers alone, no tensor read (a fleet's ingress)."""

    def sha256(self) -> str:
        """The model's identity: the sha256 of the files hashed_files names, by content."""

    def hashed_files(self, check: Callable[[Path], None] = lambda file: None) -> list[Path]:
        """The files sha256 hashes; `check` sees each before anything opens it."""

    def check_opened(self, fds: list[int]) -> None:
        """Refuses (ModelLoadError) files opened by pinned_files that are not this format."""

    def sha256_of(self, files: list[Path], digests: list[str]) -> str:
        """sha256 from the digests of hashed_files' files, as sha256 forms it."""


def model_source(path: Path) -> ModelSource:
    """The one place the format is decided."""
    path = Path(path)
    return CheckpointSource(path) if path.is_dir() else GGUFSource(path)


@contextlib.contextmanager
def pinned_files(source: ModelSource) -> Iterator[Callable[[], str]]:
    """Opens each file source.sha256 hashes once (a regular file, else OSError or ModelLoadError)
    and yields what hashes them through those same descriptors: call it once the model is read
    and built, and the sha256 names the bytes loaded. A file renamed over or rewritten
    meanwhile is a ModelLoadError then, never a sha256 of other bytes; and nothing is hashed
    before source.read's checks have passed (a file that is not a model is never read whole)."""
    files = source.hashed_files()
    opened: list[tuple[int, os.stat_result]] = []
    try:
        for file in files:
            fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a FIFO must not block the open
            opened.append((fd, os.fstat(fd)))
            if not stat.S_ISREG(opened[-1][1].st_mode):
                raise ModelLoadError(f"{file}: not a regular file")
        source.check_opened([fd for fd, _ in opened])

        def sha256() -> str:
            digests = [_fd_sha256(fd) for fd, _ in opened]
            for file, (fd, before) in zip(files, opened):
                if not _same_file(before, os.fstat(fd), os.stat(file)):
                    raise ModelLoadError(f"{file}: changed while it was read; load it again once it is written")
            return source.sha256_of(files, digests)

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
