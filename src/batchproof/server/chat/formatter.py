"""The chat.completion reply and its chat.completion.chunk stream."""

import time
from dataclasses import dataclass

from batchproof.engine.outputs import RequestOutput
from batchproof.engine.text.tokenizer import Tokenizer
from batchproof.server.errors import count_mismatch
from batchproof.server.reply.entries import (
    chat_entry,
    delta_token_ids,
    end_entry,
    prompt_logprobs,
    reply_token_ids,
    summed_usage,
)
from batchproof.server.reply.formatter import ChunkStream
from batchproof.server.reply.receipt import ReceiptBook
from batchproof.server.reply.routed_experts import routed_experts
from batchproof.server.reply.weight_versions import chunk_versions, reply_versions
from batchproof.server.tools import reply as tool_reply
from batchproof.server.tools.choice import ToolPlan


@dataclass(frozen=True)
class ChatShape:
    """What the request asked to see: the same for every choice (as completions' CompletionsShape)."""

    wants_records: bool  # `logprobs: true`
    include_usage: bool
    num_prompt_logprobs: int | None = None  # vLLM's prompt_logprobs (never streamed)
    label: dict[str, str] | None = None  # under a constraint: which it was, and raw or processed (plan.logprobs_label)
    # Tool calls: each choice's text read as calls (None, or a plan that makes none: plain text).
    tool_plan: ToolPlan | None = None
    return_token_ids: bool = False  # vLLM's: the prompt's ids at the top, each choice's generated ids on it
    as_ids: bool = False  # vLLM's return_tokens_as_token_ids: entries spelled `token_id:N`


class ChatFormatter(ChunkStream):
    def __init__(self, request_id: str, model: str, tokenizer: Tokenizer, prompt_ids: list[int], num_choices: int,
                 shape: ChatShape, receipts: ReceiptBook | None = None) -> None:
        self.base = {"id": request_id, "created": int(time.time()), "model": model}
        self.head = {**self.base, "object": "chat.completion.chunk"}
        self.tokenizer = tokenizer
        self.prompt_ids = prompt_ids
        self.num_choices = num_choices
        self.wants_records = shape.wants_records
        self.include_usage = shape.include_usage
        self.num_prompt_logprobs = shape.num_prompt_logprobs
        self.label = shape.label or {}
        self.tool_plan = shape.tool_plan if shape.tool_plan is not None and shape.tool_plan.makes_calls else None
        self.tool_replies = [tool_reply.ToolReply(self.tool_plan) for _ in range(num_choices)] if self.tool_plan else []
        self.return_token_ids = shape.return_token_ids
        self.wants_token_ids = shape.return_token_ids  # the runner checks a stream's count
        self.as_ids = shape.as_ids
        self.receipts = receipts  # a receipt on each choice's last chunk, or on the whole choice

    def first_chunks(self) -> list[dict]:
        # stream_mode "live": chunks leave as tokens are made (the probe's S7 reads it).
        chunks = [{**self.head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                             "finish_reason": None}], "stream_mode": "live"}
                  for i in range(self.num_choices)]
        if self.return_token_ids:  # on the first chunk only, as vLLM sends it
            chunks[0]["prompt_token_ids"] = self.prompt_ids
        return chunks

    def chunks(self, index: int, out: RequestOutput) -> list[dict]:
        if self.receipts is not None:
            self.receipts.add(index, out)
        delta, finish_reason = ({"content": out.text} if out.text else {}), out.finish_reason
        if self.tool_plan is not None:
            delta, finish_reason = self._tool_delta(index, out)
        choice: dict = {"index": index, "delta": delta}
        # An entry rides on the chunk that carries its token's text, or that holds it back while
        # it may be part of a tool call (the calls' tokens have entries too).
        if self.wants_records and out.records:
            choice["logprobs"] = {"content": [chat_entry(self.tokenizer, r, self.as_ids) for r in out.records],
                                  **self.label}
        elif not delta and finish_reason is None and not (self.return_token_ids and out.token_ids):
            return []  # all of it held back, and no entry or id to carry
        choice["finish_reason"] = finish_reason
        if self.return_token_ids:  # the ids ride exactly where the entries do (the end token on the last)
            choice["token_ids"] = delta_token_ids(out)
        self._add_end(choice, out)
        choice |= chunk_versions(out)  # which weights chose this chunk's tokens
        choice |= routed_experts(out)  # on the last chunk, when asked for
        if self.receipts is not None and out.finish_reason is not None:
            choice["receipt"] = self.receipts.receipt(index)
        return [{**self.head, "choices": [choice]}]

    def _add_end(self, choice: dict, last: RequestOutput) -> None:
        """The end-of-turn token's entry beside, never inside, logprobs.content: one entry per
        text token there, as OpenAI's clients read it."""
        end = end_entry(self.tokenizer, last, self.as_ids) if self.wants_records else None
        if end is not None:
            choice["end_token"] = end

    def _tool_delta(self, index: int, out: RequestOutput) -> tuple[dict, str | None]:
        replying = self.tool_replies[index]
        content, calls = replying.feed(out.text)
        finish_reason = None
        if out.finish_reason is not None:
            more_content, more_calls = replying.finish()
            content, calls = content + more_content, calls + more_calls
            finish_reason = replying.finish_reason(out.finish_reason)
        delta: dict = {}
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        return delta, finish_reason

    def last_chunks(self, lasts: list[RequestOutput]) -> list[dict]:
        if not self.include_usage:
            return []
        return [{**self.head, "choices": [], "usage": summed_usage(lasts, self.num_choices)}]

    def _choice(self, index: int, outputs: list[RequestOutput]) -> dict:
        last = outputs[-1]
        text = "".join(o.text for o in outputs)
        message, finish_reason = {"role": "assistant", "content": text}, last.finish_reason
        if self.tool_plan is not None:
            message, finish_reason = tool_reply.whole(self.tool_plan, text, last.finish_reason)
        choice: dict = {"index": index, "message": message}
        if self.wants_records:
            entries = [chat_entry(self.tokenizer, r, self.as_ids) for o in outputs for r in o.records]
            if len(entries) != last.num_kept_tokens:
                raise count_mismatch(len(entries), last.num_kept_tokens)
            choice["logprobs"] = {"content": entries, **self.label}
        choice["finish_reason"] = finish_reason
        if self.return_token_ids:
            choice["token_ids"] = reply_token_ids(outputs)
        self._add_end(choice, last)
        choice |= reply_versions(outputs)  # which weights chose the reply's tokens
        choice |= routed_experts(last)
        if self.receipts is not None:
            choice["receipt"] = self.receipts.receipt(index, outputs)
        return choice

    def whole(self, outputs: list[list[RequestOutput]]) -> dict:
        reply = {**self.base, "object": "chat.completion",
                 "choices": [self._choice(i, o) for i, o in enumerate(outputs)],
                 "usage": summed_usage([o[-1] for o in outputs], self.num_choices)}
        if self.num_prompt_logprobs is not None:  # vLLM puts them beside the choices: one prompt
            reply["prompt_logprobs"] = prompt_logprobs(self.tokenizer, self.prompt_ids, outputs[0][0].prompt_records,
                                                       self.num_prompt_logprobs)
        if self.return_token_ids:
            reply["prompt_token_ids"] = self.prompt_ids
        return reply
