"""The chat.completion reply and its chat.completion.chunk stream."""

import time

from batchproof.engine.sequence import RequestOutput
from batchproof.engine.tokenizer import Tokenizer
from batchproof.server.errors import count_mismatch
from batchproof.server.formatting.entries import chat_entry, usage


class ChatFormatter:
    def __init__(self, request_id: str, model: str, tokenizer: Tokenizer, wants_records: bool,
                 include_usage: bool) -> None:
        self.base = {"id": request_id, "created": int(time.time()), "model": model}
        self.head = {**self.base, "object": "chat.completion.chunk"}
        self.tokenizer = tokenizer
        self.wants_records = wants_records
        self.include_usage = include_usage

    def first_chunks(self) -> list[dict]:
        # stream_mode "live": chunks leave as tokens are made (the probe's S7 reads it).
        return [{**self.head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                           "finish_reason": None}], "stream_mode": "live"}]

    def chunk(self, out: RequestOutput) -> dict:
        choice: dict = {"index": 0, "delta": {"content": out.text} if out.text else {}}
        if self.wants_records and out.records:  # an entry rides on the chunk that carries its text
            choice["logprobs"] = {"content": [chat_entry(self.tokenizer, r) for r in out.records]}
        choice["finish_reason"] = out.finish_reason
        return {**self.head, "choices": [choice]}

    def usage_chunk(self, last: RequestOutput) -> dict | None:
        if not self.include_usage:
            return None
        return {**self.head, "choices": [], "usage": usage(last.num_prompt_tokens, last.num_output_tokens)}

    def whole(self, outputs: list[RequestOutput]) -> dict:
        last = outputs[-1]
        choice: dict = {"index": 0, "message": {"role": "assistant", "content": "".join(o.text for o in outputs)}}
        if self.wants_records:
            entries = [chat_entry(self.tokenizer, r) for o in outputs for r in o.records]
            if len(entries) != last.num_kept_tokens:
                raise count_mismatch(len(entries), last.num_kept_tokens)
            choice["logprobs"] = {"content": entries}
        choice["finish_reason"] = last.finish_reason
        return {**self.base, "object": "chat.completion", "choices": [choice],
                "usage": usage(last.num_prompt_tokens, last.num_output_tokens)}
