"""What the server needs of a loaded engine, as a protocol: the server is written against
this, not the concrete Engine, so another implementation (replicas elsewhere) can stand in.
Running requests goes through AsyncEngine; this is the rest: the model's facts."""

from pathlib import Path
from typing import Protocol

from batchproof.engine.chat_template import ChatTemplate
from batchproof.engine.prefix_cache import PrefixCache
from batchproof.engine.tokenizer import Tokenizer


class EngineClient(Protocol):
    tokenizer: Tokenizer
    chat_template: ChatTemplate | None  # None: the model has no chat format (completions only)
    chat_template_origin: str  # where the template came from, or why there is none
    max_model_len: int
    model_path: Path
    prefix_cache: PrefixCache | None  # its counters and bytes go to /metrics; None when off

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        """The chat template rendered for a reply, tokenized as the model expects."""

    def info(self) -> dict:
        """Everything that shapes the numbers, for /v1/server_info."""
