"""A GGUF file as the engine's ModelSource (source.py): one file, read by file.py, tokenized by tokenizer.py."""

import os
from collections.abc import Callable
from pathlib import Path

from batchproof.common.hashing import file_sha256
from batchproof.engine.model.errors import ModelLoadError
from batchproof.engine.model.gguf.file import GGUF_MAGIC, read_model_file, read_model_header
from batchproof.engine.model.gguf.tokenizer import gguf_tokenizer
from batchproof.engine.model.spec import ModelFile, ModelText


class GGUFSource:
    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self, runs_natively: Callable[[int], bool] | None = None) -> ModelFile:
        return read_model_file(self.path, runs_natively)

    def text(self, model_file: ModelFile | None = None) -> ModelText:
        """From the file read, or (None) from its header alone."""
        if model_file is None:
            metadata, context_len = read_model_header(self.path)
        else:
            metadata, context_len = model_file.metadata, model_file.spec.context_len
        try:
            tokenizer = gguf_tokenizer(metadata)
        except (ValueError, KeyError) as e:
            raise ModelLoadError(f"{self.path}: unusable tokenizer ({e})") from None
        return ModelText(tokenizer, metadata.get("tokenizer.chat_template"), "the model file", context_len)

    def sha256(self) -> str:
        return file_sha256(self.path)

    def hashed_files(self, check: Callable[[Path], None] = lambda file: None) -> list[Path]:
        check(self.path)
        return [self.path]

    def check_opened(self, fds: list[int]) -> None:
        if os.pread(fds[0], len(GGUF_MAGIC), 0) != GGUF_MAGIC:
            # Said without the bytes it starts with: the file may be anything on the machine.
            raise ModelLoadError(f"{self.path}: neither a GGUF file nor a checkpoint directory")

    def sha256_of(self, files: list[Path], digests: list[str]) -> str:
        return digests[0]
