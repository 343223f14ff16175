"""The scripted server with the quirks real servers have, for `--cache`, `--stream-parity` and any
server: a layer over its app (tests/helpers/scripted_server.py) that rewrites requests and replies.

- whole replies (`stream: false`), assembled from the scripted stream;
- logprobs that vary by step (so a reply shifted by one token shows), the chosen token's and the
  runner-up's 1.9 below it;
- `cached_tokens` from the longest prefix (in characters / 4) a request shares with an earlier one;
- quirks: fields refused with FastAPI's 422, warm replies moved by `warm_shift`, streamed logprobs
  taken from the next token, 200s without logprobs.
"""

import json
from dataclasses import dataclass, field
from typing import Any

from tests.helpers.scripted_server import Script, ScriptedServer

# A request is warm when it shares this many characters (of its JSON messages) with an earlier one;
# the probe's nonce'd cold runs share only `[{"role": "system", "content": "Session ` (38).
WARM_CHARS = 48


@dataclass
class Quirks:
    refuse: tuple[str, ...] = ()  # answered 422 when the request carries any of these fields
    warm_shift: float = 0.0  # a warm request's logprobs move down by this much
    is_stream_shifted: bool = False  # streamed entries carry the next token's logprobs
    has_logprobs: bool = True  # False: 200 without logprobs, streamed and not
    finish_reason: str | None = None  # replaces the scripted one ("length"), e.g. "stop" for an end of sequence
    seen: list[str] = field(default_factory=list)  # every prompt answered, in order
    bodies: list[dict[str, Any]] = field(default_factory=list)  # every request as it arrived


def shared_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Rewriter:
    """One reply's SSE events, rewritten event by event."""

    def __init__(self, quirks: Quirks, is_warm: bool, is_streamed: bool, cached: int) -> None:
        self.quirks, self.is_warm, self.is_streamed, self.cached = quirks, is_warm, is_streamed, cached
        self.step = 0

    def logprob(self, step: int) -> float:
        if self.is_streamed and self.quirks.is_stream_shifted:
            step += 1
        return -0.1 - 0.01 * step - (self.quirks.warm_shift if self.is_warm else 0.0)

    def event(self, doc: dict[str, Any]) -> dict[str, Any]:
        if isinstance(doc.get("usage"), dict):
            doc["usage"]["prompt_tokens_details"] = {"cached_tokens": self.cached}
        for choice in doc.get("choices") or []:
            if choice.get("finish_reason") and self.quirks.finish_reason:
                choice["finish_reason"] = self.quirks.finish_reason
            logprobs = choice.get("logprobs")
            if not self.quirks.has_logprobs:
                choice.pop("logprobs", None)
                continue
            for entry in (logprobs or {}).get("content") or []:
                value = self.logprob(self.step)
                entry["logprob"] = value
                if entry.get("top_logprobs"):
                    entry["top_logprobs"][0]["logprob"] = value
                    entry["top_logprobs"][1]["logprob"] = value - 1.9
                self.step += 1
        return doc


def whole_reply(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The events of a chat stream as one chat.completion."""
    text, entries, finish, usage = "", [], None, None
    has_logprobs = False
    for doc in events:
        usage = doc.get("usage") or usage
        for choice in doc.get("choices") or []:
            text += (choice.get("delta") or {}).get("content") or ""
            finish = choice.get("finish_reason") or finish
            if "logprobs" in choice:
                has_logprobs = True
                entries += (choice["logprobs"] or {}).get("content") or []
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
    if has_logprobs:
        choice["logprobs"] = {"content": entries}
    return {"id": "chatcmpl-fake", "object": "chat.completion", "choices": [choice], "usage": usage}


class QuirkyApp:
    """ASGI layer over the scripted app: completions pass through the quirks, the rest as is."""

    def __init__(self, inner: Any, quirks: Quirks) -> None:
        self.inner, self.quirks = inner, quirks

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            await self.inner(scope, receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        doc = json.loads(body)
        self.quirks.bodies.append(doc)
        refused = [name for name in self.quirks.refuse if name in doc]
        if refused:
            detail = [{"type": "extra_forbidden", "loc": ["body", name], "msg": "Extra inputs are not permitted",
                       "input": doc[name]} for name in refused]
            await _send_json(send, 422, {"detail": detail})
            return
        prompt = json.dumps(doc["messages"])
        shared = max((shared_prefix(prompt, earlier) for earlier in self.quirks.seen), default=0)
        self.quirks.seen.append(prompt)
        is_streamed = doc.get("stream") is True
        rewriter = Rewriter(self.quirks, shared >= WARM_CHARS, is_streamed, shared // 4 if shared >= WARM_CHARS else 0)
        inner_body = json.dumps({**doc, "stream": True}).encode()
        sent = False

        async def inner_receive() -> dict:
            # After the (rewritten) body, the client's own receive: a streaming reply listens on
            # it for a disconnect.
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": inner_body, "more_body": False}

        await self._relay(scope, inner_receive, send, rewriter, is_streamed)

    async def _relay(self, scope: dict, receive: Any, send: Any, rewriter: Rewriter, is_streamed: bool) -> None:
        events: list[dict[str, Any]] = []
        pending = b""
        status = 200

        async def inner_send(message: dict) -> None:
            nonlocal pending, status
            if message["type"] == "http.response.start":
                status = message["status"]
                if is_streamed or status != 200:
                    await send(message)
                return
            if status != 200:
                await send(message)
                return
            pending += message.get("body", b"")
            out = b""
            while b"\n\n" in pending:
                raw, pending = pending.split(b"\n\n", 1)
                payload = raw.decode().removeprefix("data: ")
                if payload.strip() == "[DONE]":
                    out += b"data: [DONE]\n\n"
                    continue
                event = rewriter.event(json.loads(payload))
                events.append(event)
                out += f"data: {json.dumps(event)}\n\n".encode()
            if is_streamed:
                await send({"type": "http.response.body", "body": out, "more_body": message.get("more_body", False)})
            elif not message.get("more_body"):
                await _send_json(send, 200, whole_reply(events))

        await self.inner(scope, receive, inner_send)


async def _send_json(send: Any, status: int, doc: dict[str, Any]) -> None:
    body = json.dumps(doc).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class QuirkyServer(ScriptedServer):
    """The scripted server behind QuirkyApp, on loopback, for a `with` block."""

    def __init__(self, script: Script | None = None, quirks: Quirks | None = None) -> None:
        super().__init__(script or Script(has_histogram=True))
        self.quirks = quirks or Quirks()
        self._server.config.app = QuirkyApp(self.app, self.quirks)
