"""What serving a model needs besides its weights: the tokenizer, the chat format and the
context length. The engine builds one; a fleet's ingress builds one from the file's header
alone, so it tokenizes and formats exactly as its replicas do without holding the weights."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchproof.engine.chat_formats import NoChatTemplate, choose_chat_template
from batchproof.engine.chat_template import ChatTemplate
from batchproof.engine.config import EngineConfig
from batchproof.engine.model.gguf_file import ModelLoadError, read_model_header
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
    def from_metadata(cls, model_path: Path, metadata: dict[str, Any], context_len: int,
                      config: EngineConfig) -> "ModelFront":
        try:
            tokenizer = Tokenizer(metadata)
        except (ValueError, KeyError) as e:
            raise ModelLoadError(f"{model_path}: unusable tokenizer ({e})") from None

        def spelling(token_id: int | None) -> str:
            return "" if token_id is None else tokenizer.spelling(token_id)

        template, origin = choose_chat_template(
            metadata.get("tokenizer.chat_template"), tokenizer.special_spellings(),
            bos_token=spelling(tokenizer.ids.bos_id), eos_token=spelling(tokenizer.ids.eos_id),
            override=config.chat_template,
        )
        max_model_len = min(config.max_model_len or DEFAULT_MAX_MODEL_LEN, context_len)
        return cls(model_path, tokenizer, template, origin, max_model_len)

    @classmethod
    def read(cls, model_path: Path, config: EngineConfig) -> "ModelFront":
        """From the GGUF header only (no tensor is read)."""
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
