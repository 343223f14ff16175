"""What serving a model needs besides its weights: the tokenizer, the chat format and the
context length. The engine builds one; a fleet's ingress builds one from the file's header
(or a checkpoint directory's config and tokenizer files) alone, so it tokenizes and formats
exactly as its replicas do without holding the weights."""

from dataclasses import dataclass
from pathlib import Path

from batchproof.engine.config import EngineConfig
from batchproof.engine.model.errors import ModelLoadError
from batchproof.engine.model.source import model_source
from batchproof.engine.model.spec import ModelText
from batchproof.engine.text.chat_formats import NoChatTemplate, choose_chat_template
from batchproof.engine.text.chat_template import ChatTemplate
from batchproof.engine.text.tokenizer import Tokenizer

DEFAULT_MAX_MODEL_LEN = 8192



def read_chat_template(path: Path | None) -> tuple[str, str] | None:
    """--chat-template's text and where it came from; a file we cannot read is a load error."""
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8"), f"--chat-template {path}"
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "strerror", None) or e
        raise ModelLoadError(f"{path}: cannot read the chat template ({reason})") from None


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
            override=read_chat_template(config.chat_template), file_origin=template_origin,
        )
        max_model_len = min(config.max_model_len or DEFAULT_MAX_MODEL_LEN, context_len)
        return cls(model_path, tokenizer, template, origin, max_model_len)

    @classmethod
    def from_text(cls, model_path: Path, text: ModelText, config: EngineConfig) -> "ModelFront":
        """From what the model's source read (model/source.py: its format decided there, once)."""
        return cls.from_tokenizer(model_path, text.tokenizer, text.chat_template, text.context_len, config,
                                  text.chat_template_origin)

    @classmethod
    def read(cls, model_path: Path, config: EngineConfig) -> "ModelFront":
        """From the GGUF header, or the checkpoint's config and headers, only (no tensor is read)."""
        source = model_source(model_path)
        return cls.from_text(source.path, source.text(), config)

    def chat_prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The chat template rendered for a reply, tokenized as the model expects."""
        if self.chat_template is None:
            raise NoChatTemplate(self.chat_template_origin)
        text = self.chat_template.render(messages, add_generation_prompt=True, tools=tools)
        ids = self.tokenizer.encode(text)
        bos = self.tokenizer.ids.bos_id
        # BOS once: added as the tokenizer says, unless the template wrote it (Gemma's, Llama 3's)
        return [bos, *ids] if self.tokenizer.ids.add_bos and bos is not None and ids[:1] != [bos] else ids
