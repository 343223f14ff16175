"""A chat plan's deltas as a Responses API reply: the `response` object, or OpenAI's semantic
events (`response.created` ... `response.completed`), each with its `sequence_number`.

The whole reply is the streamed one replayed: the same deltas go through the same state machine
and the final object is what the stream's last event carries, so the two cannot differ.

Logprobs: each delta's entries ride on the event that carries its text (`output_text.delta`'s
`logprobs`). A function call's tokens have entries too, which OpenAI's shape has no place for:
they ride on `function_call_arguments.delta` and the call item as `logprobs` (our extension), so
every generated token's entry is in the reply, in order, as on the chat route. Entries held back
with text that may be a call go out on the next event; the last ones (an end-of-sequence token)
on a last, empty delta of the item then open.
"""

import time
import uuid
from collections.abc import Callable
from typing import Any

from batchproof.common.wire import dumps
from batchproof.engine.outputs import RequestOutput
from batchproof.engine.text.tokenizer import Tokenizer
from batchproof.server.errors import APIError, count_mismatch
from batchproof.server.reply.entries import chat_entry
from batchproof.server.reply.receipt import ReceiptBook
from batchproof.server.reply.routed_experts import routed_experts
from batchproof.server.reply.weight_versions import reply_versions
from batchproof.server.tools import reply as tool_reply
from batchproof.server.tools.choice import ToolPlan

# A reply that did not end by itself, as OpenAI's `incomplete_details.reason` (status and item
# `incomplete`): cut by max_output_tokens, or aborted (/abort_requests, a pause in abort mode:
# ours, as chat's finish_reason "abort" is vLLM's).
INCOMPLETE_REASONS = {"length": "max_output_tokens", "abort": "abort"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(last: RequestOutput) -> dict[str, Any]:
    return {"input_tokens": last.num_prompt_tokens,
            "input_tokens_details": {"cached_tokens": last.num_cached_tokens},
            "output_tokens": last.num_output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": last.num_prompt_tokens + last.num_output_tokens}


class ResponsesFormatter:
    stream_end = b""  # the Responses stream ends with its last event, no [DONE]
    wants_token_ids = False  # return_token_ids is a chat and completions field

    def __init__(self, echo: dict[str, Any], tokenizer: Tokenizer, wants_records: bool,
                 label: dict[str, str] | None, tool_plan: ToolPlan | None,
                 on_done: Callable[[dict[str, Any]], None] | None = None, receipts: ReceiptBook | None = None) -> None:
        """`echo`: the response object's fields that restate the request (id, model, tools...);
        `on_done`: given the final response object of a reply that completed (to store it);
        `receipts`: the final response carries the reply's receipt (stored with it)."""
        self.echo = echo
        self.created_at = int(time.time())
        self.tokenizer = tokenizer
        self.wants_records = wants_records
        self.label = label or {}  # under a constraint: which, and raw or processed (plan.logprobs_label)
        self.tool_reply = tool_reply.ToolReply(tool_plan) if tool_plan is not None and tool_plan.makes_calls else None
        self.on_done = on_done
        self.sequence_number = 0
        self.items: list[dict[str, Any]] = []
        self.is_open = False  # the last item still takes deltas
        self.pending: list[dict[str, Any]] = []  # entries whose text is held back
        self.num_entries = 0
        self.deltas: list[RequestOutput] = []  # for the weight versions (and receipt) the final response names
        self.receipts = receipts

    # --- the stream

    def encode(self, event: dict[str, Any]) -> bytes:
        return f"event: {event['type']}\ndata: {dumps(event)}\n\n".encode()

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, **fields, "sequence_number": self.sequence_number}
        self.sequence_number += 1
        return event

    def response(self, status: str, last: RequestOutput | None = None) -> dict[str, Any]:
        incomplete = ({"reason": INCOMPLETE_REASONS[last.finish_reason]}
                      if status == "incomplete" and last is not None else None)
        return {"id": self.echo["id"], "object": "response", "created_at": self.created_at, "status": status,
                "error": None, "incomplete_details": incomplete, **{k: v for k, v in self.echo.items() if k != "id"},
                "output": [dict(item) for item in self.items] if status != "in_progress" else [],
                "usage": usage(last) if last is not None else None,
                **(reply_versions(self.deltas) if last is not None and self.deltas else {})}

    def first_chunks(self) -> list[dict]:
        # stream_mode "live" (ours, as on the chat route): events leave as tokens are made (the probe's S7 reads it).
        return [self._event("response.created", response=self.response("in_progress"), stream_mode="live"),
                self._event("response.in_progress", response=self.response("in_progress"))]

    def chunks(self, index: int, out: RequestOutput) -> list[dict]:
        self.deltas.append(out)
        if self.wants_records:
            self.pending += [chat_entry(self.tokenizer, r) for r in out.records]
            self.num_entries += len(out.records)
        content, calls = out.text, []
        if self.tool_reply is not None:
            content, calls = self.tool_reply.feed(out.text)
            if out.finish_reason is not None:
                more_content, more_calls = self.tool_reply.finish()
                content, calls = content + more_content, calls + more_calls
        events = self._text(content) if content else []
        for call in calls:
            events += self._call(call)
        if out.finish_reason is not None:
            if not self.items:  # an empty reply is still a message, with empty text
                events += self._open_message()
            if self.pending:
                events += self._text("") if self.items[-1]["type"] == "message" else self._arguments("")
            events += self._close(out.finish_reason)
        return events

    def _open_message(self) -> list[dict]:
        events = self._close("stop")
        part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": [], **self.label}
        if self.wants_records:
            part["logprobs"] = []
        item = {"id": new_id("msg"), "type": "message", "status": "in_progress", "role": "assistant", "content": []}
        self.items.append(item)
        self.is_open = True
        where = self._where()
        events.append(self._event("response.output_item.added", output_index=where["output_index"],
                                  item={**item, "content": []}))
        item["content"].append(part)
        return [*events, self._event("response.content_part.added", **where, content_index=0, part=dict(part))]

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1}

    def _text(self, text: str) -> list[dict]:
        events = [] if self.is_open and self.items[-1]["type"] == "message" else self._open_message()
        part = self.items[-1]["content"][0]
        part["text"] += text
        entries, self.pending = self.pending, []
        if self.wants_records:
            part["logprobs"] = part["logprobs"] + entries
        return [*events, self._event("response.output_text.delta", **self._where(), content_index=0, delta=text,
                                     logprobs=entries)]

    def _call(self, call: dict[str, Any]) -> list[dict]:
        """A chat tool-call delta: one with an id opens a function_call item; the rest add arguments."""
        events: list[dict] = []
        if "id" in call:
            events += self._close("stop")
            item: dict[str, Any] = {"id": new_id("fc"), "type": "function_call", "status": "in_progress",
                                    "call_id": call["id"], "name": call["function"]["name"], "arguments": ""}
            if self.wants_records:
                item["logprobs"] = []
            self.items.append(item)
            self.is_open = True
            events.append(self._event("response.output_item.added", output_index=len(self.items) - 1, item=dict(item)))
        arguments = call["function"].get("arguments", "")
        return events + (self._arguments(arguments) if arguments or self.pending else [])

    def _arguments(self, text: str) -> list[dict]:
        item = self.items[-1]
        item["arguments"] += text
        entries, self.pending = self.pending, []
        extra = {}
        if self.wants_records:
            item["logprobs"] = item["logprobs"] + entries
            extra = {"logprobs": entries}
        return [self._event("response.function_call_arguments.delta", **self._where(), delta=text, **extra)]

    def _close(self, finish_reason: str) -> list[dict]:
        """Close the open item: `incomplete` when the reply was cut (by max_output_tokens, or an abort)."""
        if not self.is_open:
            return []
        self.is_open = False
        item, where = self.items[-1], self._where()
        item["status"] = "incomplete" if finish_reason in INCOMPLETE_REASONS else "completed"
        events = []
        if item["type"] == "message":
            part = item["content"][0]
            text_done = {"text": part["text"], **({"logprobs": part["logprobs"]} if self.wants_records else {})}
            events += [self._event("response.output_text.done", **where, content_index=0, **text_done),
                       self._event("response.content_part.done", **where, content_index=0, part=dict(part))]
        else:
            events.append(self._event("response.function_call_arguments.done", **where, name=item["name"],
                                      arguments=item["arguments"]))
        return [*events, self._event("response.output_item.done", output_index=where["output_index"],
                                     item=dict(item))]

    def _final(self, last: RequestOutput) -> dict[str, Any]:
        if self.wants_records and self.num_entries != last.num_kept_tokens:
            raise count_mismatch(self.num_entries, last.num_kept_tokens)
        response = self.response("incomplete" if last.finish_reason in INCOMPLETE_REASONS else "completed", last)
        response |= routed_experts(last)  # one reply: beside its usage, in the completed event when streamed
        if self.receipts is not None:
            response["receipt"] = self.receipts.receipt(0, self.deltas)
        if self.on_done is not None:
            self.on_done(response)
        return response

    def last_chunks(self, lasts: list[RequestOutput]) -> list[dict]:
        response = self._final(lasts[0])
        return [self._event(f"response.{response['status']}", response=response)]

    def error_chunks(self, error: APIError) -> list[dict]:
        failed = {**self.response("failed"), "error": {"code": error.code or error.type, "message": error.message}}
        return [self._event("error", code=error.code or error.type, message=error.message, param=error.param),
                self._event("response.failed", response=failed)]

    # --- the whole reply

    def whole(self, outputs: list[list[RequestOutput]]) -> dict:
        for out in outputs[0]:
            if out.text or out.finish_reason is not None:  # as the runner streams them
                self.chunks(0, out)
        return self._final(outputs[0][-1])
