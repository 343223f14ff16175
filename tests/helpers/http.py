"""Helpers for the live-server tests: raw requests, SSE parsing, error envelopes, waiting."""

import json
import time
from collections.abc import Callable

import httpx

# Greedy prompts whose replies the tests lean on (SmolLM2-135M-Instruct, float32, CPU).
ASCII_PROMPT = "Name three colors of the rainbow."
CJK_PROMPT = 'Say "日本語"'  # the reply starts with 日本語, each character split over 2-3 tokens
EMOJI_PROMPT = "Repeat exactly: 🎉🎉🎉"  # the reply repeats the emoji, 3 byte tokens each

# Two real tokens whose output-embedding rows are bit-identical (tied embeddings), so their
# logits are always exactly equal: with the same logit_bias they tie for first place.
TIED_TOKEN_IDS = (36744, 48047)  # "ManagementPlaneProtection", " InstancePreprocess"


def messages(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def chat_body(content: str, **fields) -> dict:
    """A greedy chat request for one user message."""
    return {"messages": messages(content), "temperature": 0, **fields}


def post(url: str, path: str, body: object, timeout: float = 60, **kwargs) -> httpx.Response:
    if isinstance(body, bytes | str):  # a raw body, still declared JSON (else a 415 before it is read)
        headers = dict(kwargs.pop("headers", {}))
        if not any(name.lower() == "content-type" for name in headers):
            headers["content-type"] = "application/json"
        return httpx.post(url + path, content=body, timeout=timeout, headers=headers, **kwargs)
    return httpx.post(url + path, json=body, timeout=timeout, **kwargs)


def parse_sse(raw: str) -> list[dict | str]:
    """The events of an SSE body: each `data: <json>` as a dict, `[DONE]` as the string."""
    assert raw.endswith("\n\n"), f"SSE body does not end with a blank line: {raw[-80:]!r}"
    events: list[dict | str] = []
    for block in raw.split("\n\n")[:-1]:
        assert block.startswith("data: "), f"not an SSE data event: {block[:80]!r}"
        data = block[len("data: "):]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def stream(url: str, path: str, body: dict, timeout: float = 60) -> tuple[httpx.Response, str, list[dict | str]]:
    """POST with stream: true; the response, its raw body and its events."""
    response = httpx.post(url + path, json={**body, "stream": True}, timeout=timeout)
    raw = response.text
    assert response.status_code == 200, raw
    assert response.headers["content-type"].startswith("text/event-stream")
    return response, raw, parse_sse(raw)


def chunks(events: list[dict | str]) -> list[dict]:
    """The chunk objects of a finished stream (checks it ends with exactly one [DONE])."""
    assert events and events[-1] == "[DONE]", f"stream did not end with [DONE]: {events[-1:]!r}"
    assert events.count("[DONE]") == 1
    return [e for e in events[:-1] if isinstance(e, dict)]


def streamed_chat(events: list[dict | str]) -> tuple[str, list[dict], str | None]:
    """(content, logprobs entries in order, finish_reason) of a streamed chat reply."""
    content, entries, finish = "", [], None
    for chunk in chunks(events):
        for choice in chunk["choices"]:
            content += choice["delta"].get("content") or ""
            if choice.get("logprobs"):
                entries += choice["logprobs"]["content"]
            if choice.get("finish_reason") is not None:
                assert finish is None, "two chunks carry a finish_reason"
                finish = choice["finish_reason"]
    return content, entries, finish


def joined_bytes(entries: list[dict]) -> bytes:
    return b"".join(bytes(e["bytes"]) for e in entries)


def assert_error(response: httpx.Response, status: int, param: str | None = "<any>",
                 mentions: tuple[str, ...] = (), code: str | None = "<any>") -> dict:
    """The response is `status` with OpenAI's error envelope; its message names each of `mentions`."""
    assert response.status_code == status, f"expected {status}, got {response.status_code}: {response.text}"
    body = response.json()
    assert list(body) == ["error"], body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    if param != "<any>":
        assert error["param"] == param, error
    if code != "<any>":
        assert error["code"] == code, error
    for word in mentions:
        assert word in error["message"], f"{word!r} not in {error['message']!r}"
    return error


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def char_starts(entries: list[dict]) -> list[int]:
    """For each token, how many characters of the strictly decoded reply come before its first byte."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    starts, length = [], 0
    for entry in entries:
        starts.append(length)
        length += len(decoder.decode(bytes(entry["bytes"])))
    return starts
