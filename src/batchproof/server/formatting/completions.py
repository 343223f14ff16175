"""The legacy text_completion reply and stream, with echo and prompt scoring."""

import time

from batchproof.engine.sequence import RequestOutput
from batchproof.engine.tokenizer import Tokenizer
from batchproof.server.errors import count_mismatch
from batchproof.server.formatting.entries import TextOffsets, legacy_logprobs, usage


class CompletionsFormatter:
    def __init__(self, request_id: str, model: str, tokenizer: Tokenizer, prompt_ids: list[int],
                 wants_records: bool, echo: bool, include_usage: bool) -> None:
        self.base = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": model}
        self.tokenizer = tokenizer
        self.prompt_ids = prompt_ids
        self.wants_records = wants_records
        self.echo = echo
        self.include_usage = include_usage
        self.offsets = TextOffsets(tokenizer)  # one running count of characters across a stream's chunks

    def first_chunks(self) -> list[dict]:
        return []

    def chunk(self, out: RequestOutput) -> dict:
        choice: dict = {"index": 0, "text": out.text, "finish_reason": out.finish_reason, "logprobs": None}
        if self.wants_records:
            token_ids = [r.token_id for r in out.records]
            choice["logprobs"] = legacy_logprobs(self.tokenizer, out.records, token_ids, self.offsets)
        return {**self.base, "choices": [choice]}

    def usage_chunk(self, last: RequestOutput) -> dict | None:
        if not self.include_usage:
            return None
        return {**self.base, "choices": [], "usage": usage(last.num_prompt_tokens, last.num_output_tokens)}

    def whole(self, outputs: list[RequestOutput]) -> dict:
        last = outputs[-1]
        prefix = self.tokenizer.decode(self.prompt_ids) if self.echo else ""
        choice: dict = {"index": 0, "text": prefix + "".join(o.text for o in outputs),
                        "finish_reason": last.finish_reason, "logprobs": None}
        if self.wants_records:
            records = [r for o in outputs for r in o.records]
            if len(records) != last.num_kept_tokens:
                raise count_mismatch(len(records), last.num_kept_tokens)
            token_ids = [r.token_id for r in records]
            scored: list = []
            if self.echo:  # the first prompt token has nothing before it to be scored from
                scored = outputs[0].prompt_records or [None] * len(self.prompt_ids)
                token_ids = self.prompt_ids + token_ids
            choice["logprobs"] = legacy_logprobs(self.tokenizer, scored + records, token_ids,
                                                 TextOffsets(self.tokenizer))
        return {**self.base, "choices": [choice], "usage": usage(last.num_prompt_tokens, last.num_output_tokens)}
