"""A Hugging Face checkpoint directory as the engine's ModelSource (source.py): config.json and
the safetensors files, read by checkpoint.py, tokenized by tokenizer.py."""

import os
from collections.abc import Callable
from pathlib import Path

from batchproof.engine.model.hf.checkpoint import (
    CONFIG_FILE,
    INDEX_FILE,
    checkpoint_identity,
    checkpoint_sha256,
    inspect_checkpoint,
    read_checkpoint,
    safetensors_files,
)
from batchproof.engine.model.hf.tokenizer import checkpoint_chat_template, checkpoint_tokenizer
from batchproof.engine.model.spec import ModelFile, ModelText


class CheckpointSource:
    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self, runs_natively: Callable[[int], bool] | None = None) -> ModelFile:
        return read_checkpoint(self.path, runs_natively)

    def text(self, model_file: ModelFile | None = None) -> ModelText:
        """From the checkpoint read, or (None) from its config and headers alone: tokenizer.json,
        its token configs and chat template."""
        if model_file is None:
            checkpoint = inspect_checkpoint(self.path)
            directory, config, spec = checkpoint.path, checkpoint.config, checkpoint.spec
        else:
            directory, config, spec = model_file.path, model_file.metadata, model_file.spec
        tokenizer = checkpoint_tokenizer(directory, config, spec.vocab_size)
        template, origin = checkpoint_chat_template(directory)
        return ModelText(tokenizer, template, origin, spec.context_len)

    def sha256(self) -> str:
        """config.json and every safetensors file, by content."""
        return checkpoint_sha256(self.path)

    def hashed_files(self, check: Callable[[Path], None] = lambda file: None) -> list[Path]:
        """config.json and the safetensors files; `check` sees the safetensors index before it is read."""
        path = self.path
        check(path / CONFIG_FILE)
        if os.path.lexists(path / INDEX_FILE):
            check(path / INDEX_FILE)
        shards = safetensors_files(path)
        for shard in shards:
            check(shard)
        return [path / CONFIG_FILE, *shards]

    def check_opened(self, fds: list[int]) -> None:
        pass  # each file is checked as it is read

    def sha256_of(self, files: list[Path], digests: list[str]) -> str:
        return checkpoint_identity(files, digests)
