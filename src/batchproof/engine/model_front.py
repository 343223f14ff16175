"""What serving a model needs besides its weights: the tokenizer, the chat format and the
context length. The engine builds one; a fleet's ingress builds one from the file's header
(or a checkpoint directory's config and tokenizer files) alone, so it tokenizes and formats
exactly as its replicas do without holding the weights."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchproof.engine.chat_formats import NoChatTemplate, choose_chat_template
from batchproof.engine.chat_template import ChatTemplate
from batchproof.engine.config import EngineConfig
from batchproof.engine.hf_tokenizer import checkpoint_chat_template, checkpoint_tokenizer
from batchproof.engine.model.gguf_file import ModelFile, ModelLoadError, read_model_header
from batchproof.engine.model.hf_checkpoint import CheckpointFile, inspect_checkpoint
from batchproof.engine.model.model_source import is_checkpoint_dir
from batchproof.engine.tokenizer import Tokenizer

DEFAULT_MAX_MODEL_LEN = 8192


@dataclass(frozen=True)
class ModelFront:
    model_path: Path
    tokenizer: Tokenizer
    chat_template: ChatTemplate | None  # None: the model has no chat format (completions only)
    chat_template_origin: str  # where the template came from, or why there is none
    max_model_len: int

    @classmethod
    def from_tokenizer(cls, model_path: Path, tokenizer: Tokenizer, template_source: str | None, context_len: int,
                       config: EngineConfig, template_origin: str = "the model file") -> "ModelFront":
        def spelling(token_id: int | None) -> str:
            return "" if token_id is None else tokenizer.spelling(token_id)

        template, origin = choose_chat_template(
            template_source, tokenizer.special_spellings(),
            bos_token=spelling(tokenizer.ids.bos_id), eos_token=spelling(tokenizer.ids.eos_id),
            override=config.chat_template, file_origin=template_origin,
        )
        max_model_len = min(config.max_model_len or DEFAULT_MAX_MODEL_LEN, context_len)
        return cls(model_path, tokenizer, template, origin, max_model_len)

    @classmethod
    def from_metadata(cls, model_path: Path, metadata: dict[str, Any], context_len: int,
                      config: EngineConfig) -> "ModelFront":
        try:
            tokenizer = Tokenizer(metadata)
        except (ValueError, KeyError) as e:
            raise ModelLoadError(f"{model_path}: unusable tokenizer ({e})") from None
        return cls.from_tokenizer(model_path, tokenizer, metadata.get("tokenizer.chat_template"), context_len, config)

    @classmethod
    def from_checkpoint(cls, directory: Path, hf_config: dict[str, Any], vocab_rows: int, context_len: int,
                        config: EngineConfig) -> "ModelFront":
        """From a checkpoint directory's tokenizer.json, its token configs and chat template."""
        tokenizer = checkpoint_tokenizer(directory, hf_config, vocab_rows)
        template, origin = checkpoint_chat_template(directory)
        return cls.from_tokenizer(directory, tokenizer, template, context_len, config, origin)

    @classmethod
    def for_model_file(cls, model_file: ModelFile, config: EngineConfig) -> "ModelFront":
        spec = model_file.spec
        if isinstance(model_file, CheckpointFile):
            return cls.from_checkpoint(model_file.path, model_file.metadata, spec.vocab_size, spec.context_len, config)
        return cls.from_metadata(model_file.path, model_file.metadata, spec.context_len, config)

    @classmethod
    def read(cls, model_path: Path, config: EngineConfig) -> "ModelFront":
        """From the GGUF header, or the checkpoint's config and headers, only (no tensor is read)."""
        if is_checkpoint_dir(model_path):
            checkpoint = inspect_checkpoint(model_path)
            spec = checkpoint.spec
            return cls.from_checkpoint(checkpoint.path, checkpoint.config, spec.vocab_size, spec.context_len, config)
        metadata, context_len = read_model_header(model_path)
        return cls.from_metadata(model_path, metadata, context_len, config)

    def chat_prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The chat template rendered for a reply, tokenized as the model expects."""
        if self.chat_template is None:
            raise NoChatTemplate(self.chat_template_origin)
        text = self.chat_template.render(messages, add_generation_prompt=True, tools=tools)
        ids = self.tokenizer.encode(text)
        bos = self.tokenizer.ids.bos_id
        # BOS once: added as the tokenizer says, unless the template wrote it (Gemma's, Llama 3's)
        return [bos, *ids] if self.tokenizer.ids.add_bos and bos is not None and ids[:1] != [bos] else ids
