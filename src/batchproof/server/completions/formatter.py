"""The legacy text_completion reply and stream, with echo, prompt scoring and several prompts."""

import time
from dataclasses import dataclass

from batchproof.engine.outputs import RequestOutput
from batchproof.engine.text.tokenizer import Tokenizer
from batchproof.server.errors import count_mismatch
from batchproof.server.reply.entries import (
    TextOffsets,
    delta_token_ids,
    end_entry,
    legacy_logprobs,
    prompt_logprobs,
    prompt_token_id_logprobs,
    reply_token_ids,
    summed_usage,
)
from batchproof.server.reply.formatter import ChunkStream
from batchproof.server.reply.receipt import ReceiptBook
from batchproof.server.reply.routed_experts import routed_experts
from batchproof.server.reply.weight_versions import chunk_versions, reply_versions


@dataclass(frozen=True)
class CompletionsShape:
    """What the request asked to see: the same for every choice."""

    num_logprobs: int | None  # `logprobs`: None for no logprobs
    echo: bool
    num_prompt_logprobs: int | None  # vLLM's prompt_logprobs
    include_usage: bool
    label: dict[str, str] | None = None  # under a constraint: which it was, and raw or processed
    return_token_ids: bool = False  # vLLM's: each choice's prompt_token_ids and (generated) token_ids
    as_ids: bool = False  # vLLM's return_tokens_as_token_ids: tokens spelled `token_id:N`
    named_rows: tuple[int, int] | None = None  # prompt_logprob_token_ids: (prompt_logprob_start, rows)


class CompletionsFormatter(ChunkStream):
    def __init__(self, request_id: str, model: str, tokenizer: Tokenizer, prompts: list[list[int]], n: int,
                 shape: CompletionsShape, receipts: ReceiptBook | None = None) -> None:
        self.base = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": model}
        self.tokenizer = tokenizer
        self.prompts = prompts
        self.n = n
        self.shape = shape
        self.wants_records = shape.num_logprobs is not None
        self.include_usage = shape.include_usage
        # One running count of characters per choice, across a stream's chunks.
        self.offsets = [TextOffsets(tokenizer) for _ in range(len(prompts) * n)]
        self.wants_token_ids = shape.return_token_ids  # the runner checks a stream's count
        self.opened: set[int] = set()  # choices whose first chunk (with prompt_token_ids) is out
        self.receipts = receipts  # a receipt on each choice's last chunk, or on the whole choice

    def first_chunks(self) -> list[dict]:
        return []

    def chunks(self, index: int, out: RequestOutput) -> list[dict]:
        if self.receipts is not None:
            self.receipts.add(index, out)
        choice: dict = {"index": index, "text": out.text, "finish_reason": out.finish_reason, "logprobs": None}
        if self.wants_records:
            token_ids = [r.token_id for r in out.records]
            choice["logprobs"] = {**legacy_logprobs(self.tokenizer, out.records, token_ids, self.offsets[index],
                                                    self.shape.num_logprobs, self.shape.as_ids),
                                  **(self.shape.label or {})}
        if self.shape.return_token_ids:  # as vLLM: the prompt's ids on a choice's first chunk only
            if index not in self.opened:
                choice["prompt_token_ids"] = self.prompts[index // self.n]
                self.opened.add(index)
            choice["token_ids"] = delta_token_ids(out)  # the ids of the tokens whose text this chunk carries
        self._add_end(choice, out)
        choice |= chunk_versions(out)  # which weights chose this chunk's tokens
        choice |= routed_experts(out)  # on the last chunk, when asked for
        if self.receipts is not None and out.finish_reason is not None:
            choice["receipt"] = self.receipts.receipt(index)
        return [{**self.base, "choices": [choice]}]

    def _add_end(self, choice: dict, last: RequestOutput) -> None:
        """The end-of-turn token's entry beside the legacy lists (one entry per text token there),
        in chat's entry shape with its id, so both routes report it alike."""
        end = end_entry(self.tokenizer, last, self.shape.as_ids) if self.wants_records else None
        if end is not None:
            end["top_logprobs"] = end["top_logprobs"][:self.shape.num_logprobs]
            choice["end_token"] = end

    def last_chunks(self, lasts: list[RequestOutput]) -> list[dict]:
        if not self.include_usage:
            return []
        return [{**self.base, "choices": [], "usage": summed_usage(lasts, self.n)}]

    def _choice(self, index: int, outputs: list[RequestOutput], scored: list | None) -> dict:
        """One choice whole; `scored`: its prompt's records, None when never scored (not asked
        for, or aborted before its prefill completed)."""
        last = outputs[-1]
        prompt_ids = self.prompts[index // self.n]
        prefix = self.tokenizer.decode(prompt_ids) if self.shape.echo else ""
        choice: dict = {"index": index, "text": prefix + "".join(o.text for o in outputs),
                        "finish_reason": last.finish_reason, "logprobs": None}
        if self.wants_records:
            records = [r for o in outputs for r in o.records]
            if len(records) != last.num_kept_tokens:
                raise count_mismatch(len(records), last.num_kept_tokens)
            token_ids = [r.token_id for r in records]
            if self.shape.echo:  # the first prompt token has nothing before it to be scored from (null)
                records, token_ids = (scored or [None] * len(prompt_ids)) + records, prompt_ids + token_ids
            choice["logprobs"] = {**legacy_logprobs(self.tokenizer, records, token_ids, TextOffsets(self.tokenizer),
                                                    self.shape.num_logprobs, self.shape.as_ids),
                                  **(self.shape.label or {})}
        if self.shape.num_prompt_logprobs is not None:
            choice["prompt_logprobs"] = prompt_logprobs(self.tokenizer, prompt_ids, scored,
                                                        self.shape.num_prompt_logprobs)
        if self.shape.named_rows is not None:  # vLLM's teacher scores: [rows, K], beside prompt_logprobs
            choice["prompt_token_id_logprobs"] = prompt_token_id_logprobs(scored, *self.shape.named_rows)
        if self.shape.return_token_ids:  # generated ids only, echo or not (as vLLM)
            choice["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = reply_token_ids(outputs)
        self._add_end(choice, last)
        choice |= reply_versions(outputs)  # which weights chose the reply's tokens
        choice |= routed_experts(last)
        if self.receipts is not None:
            choice["receipt"] = self.receipts.receipt(index, outputs)
        return choice

    def whole(self, outputs: list[list[RequestOutput]]) -> dict:
        choices = []
        for index, choice_outputs in enumerate(outputs):
            # A prompt is scored by its first choice; its siblings show the same records.
            first = outputs[index - index % self.n][0]
            choices.append(self._choice(index, choice_outputs, first.prompt_records))
        return {**self.base, "choices": choices, "usage": summed_usage([o[-1] for o in outputs], self.n)}
