"""A reply's text as OpenAI's tool calls, whole or streamed (one ToolReply per choice).

- named: the text is the call's arguments (generated under their grammar), streamed as it comes.
- required: the text is a JSON array of calls (generated under its grammar), sent whole at the end;
  cut by max_tokens, the calls it completed (the unfinished one is left out: finish_reason says "length").
- auto: the model's own format, read by formats.py; text that is certainly not a call streams.
A reply cut by max_tokens keeps finish_reason "length": a named call then carries the arguments
written so far; required or auto text that does not parse stays content.
"""

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from batchproof.server.tools.choice import ToolPlan
from batchproof.server.tools.formats import ParsedCall, ToolCallSplitter


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _parsed_array(text: str) -> list[ParsedCall] | None:
    """`required`'s text: [{"name": ..., "arguments": {...}}, ...] -> its calls. Cut short (by
    max_tokens with parallel calls, say), the calls it completed; None if it completed none."""
    decoder, calls, pos = json.JSONDecoder(), [], 1
    if not text.startswith("["):
        return None
    while True:
        try:
            call, pos = decoder.raw_decode(text, pos)
            calls.append(ParsedCall(call["name"], json.dumps(call["arguments"], ensure_ascii=False)))
        # Under its grammar only a cut leaves an item unfinished; RecursionError: arguments nested
        # deeper than Python's json reads (~1,000 levels; a logit_bias on '[' writes that), which
        # then stay text, as a cut call does.
        except (ValueError, KeyError, TypeError, RecursionError):
            return calls or None
        if not text.startswith(", ", pos):
            return calls
        pos += 2


@dataclass
class ToolReply:
    plan: ToolPlan
    num_calls: int = 0  # calls sent so far (their stream indexes)
    _text: list[str] = field(default_factory=list)
    _splitter: ToolCallSplitter | None = None
    _named_id: str | None = None

    def __post_init__(self) -> None:
        if self.plan.mode == "auto":
            self._splitter = self.plan.tool_format.splitter()

    def _entries(self, calls: list[ParsedCall]) -> list[dict[str, Any]]:
        if self.plan.mode == "auto" and not self.plan.is_parallel:
            calls = calls[:1]
        entries = [{"index": self.num_calls + i, "id": new_call_id(), "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments}} for i, c in enumerate(calls)]
        self.num_calls += len(entries)
        return entries

    def feed(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """One delta's text -> (content to send now, tool-call deltas to send now)."""
        if self.plan.mode == "named":
            if self._named_id is None:  # the first delta opens the call
                self._named_id = new_call_id()
                self.num_calls = 1
                return "", [{"index": 0, "id": self._named_id, "type": "function",
                             "function": {"name": self.plan.named, "arguments": text}}]
            return "", [{"index": 0, "function": {"arguments": text}}] if text else []
        if self.plan.mode == "required":
            self._text.append(text)
            return "", []
        return self._splitter.feed(text), []

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """At the end of the reply: (content still held, the calls not yet sent)."""
        if self.plan.mode == "named":
            return "", [] if self._named_id is not None else self.feed("")[1]
        if self.plan.mode == "required":
            text = "".join(self._text)
            calls = _parsed_array(text)
            return (text, []) if calls is None else ("", self._entries(calls))
        parsed = self._splitter.finish()
        return parsed.content or "", self._entries(parsed.calls)

    def finish_reason(self, engine_reason: str | None) -> str | None:
        """`tool_calls` when the reply ended by itself with calls made; otherwise the engine's."""
        return "tool_calls" if engine_reason == "stop" and self.num_calls else engine_reason


def whole(plan: ToolPlan, text: str, engine_reason: str | None) -> tuple[dict[str, Any], str | None]:
    """The unstreamed message ({content, tool_calls}) and finish_reason."""
    reply = ToolReply(plan)
    content, calls = reply.feed(text)
    more_content, more_calls = reply.finish()
    calls += more_calls
    for call in calls:
        call.pop("index", None)
    content += more_content
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = calls
    return message, reply.finish_reason(engine_reason)
