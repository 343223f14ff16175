"""The board's built-in negative control: a tiny OpenAI-style chat server whose logprobs drift with
the batch size, as a batch-variant reduction order makes them (standard library only, no model).

Requests that arrive with no gap of `window_s` between them form one batch of m (the batch closes
once none has joined for `window_s`, so every member sees the same m however slowly a burst of 16
arrives on a busy machine); every token's logprob moves by `drift * (m - 1)`, its text never does,
so only a probe that compares logprobs bitwise catches it. Each batch is logged as `batch m=N done`
(our server's spelling), so the probe reads the batch it formed from the log, as it does ours."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODEL = "drift-control"


class Batcher:
    """Who is in the current batch: its size now and the largest it reached, logged when it empties."""

    def __init__(self, log_path: Path) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._largest = 0
        self._last_join = 0.0
        self._log_path = log_path

    def join(self) -> None:
        with self._lock:
            self._active += 1
            self._largest = max(self._largest, self._active)
            self._last_join = time.monotonic()

    def wait_closed(self, window_s: float) -> int:
        """Wait until no request has joined for `window_s`, then the batch's size (the most members
        it had: the first to finish leaves before the last reads it). A fixed wait from each member's
        own arrival let the first of a slow burst see fewer members than the last."""
        while True:
            with self._lock:
                quiet = time.monotonic() - self._last_join
                if quiet >= window_s:
                    return self._largest
            time.sleep(window_s - quiet)

    def leave(self) -> None:
        with self._lock:
            self._active -= 1
            if self._active:
                return
            largest, self._largest = self._largest, 0
            with self._log_path.open("a", encoding="utf-8") as log:
                log.write(f"INFO batch m={largest} done in 1ms (0.0 tok/s/slot)\n")


def entry(step: int, m: int, drift: float) -> dict[str, Any]:
    """Step `step`'s logprob entry in a batch of m: the chosen token and its runner-up, both moved."""
    text, shift = f" w{step}", drift * (m - 1)
    chosen = -0.1 - 0.01 * step - shift
    top = [{"token": text, "logprob": chosen, "bytes": list(text.encode())},
           {"token": " alt", "logprob": chosen - 1.9, "bytes": list(b" alt")}]
    return {**top[0], "top_logprobs": top}


class Handler(BaseHTTPRequestHandler):
    server: "DriftServer"

    def log_message(self, format: str, *args: Any) -> None:  # the board's output is the probe's
        pass

    def _json(self, status: int, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:
        if self.path != "/v1/chat/completions":
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        batcher = self.server.batcher
        batcher.join()
        try:
            m = batcher.wait_closed(self.server.window_s)  # the batch forms while every member waits
            entries = [entry(step, m, self.server.drift) for step in range(int(body.get("max_tokens") or 16))]
            if body.get("stream"):
                self._stream(entries)
            else:
                self._whole(entries)
        finally:
            batcher.leave()

    def _stream(self, entries: list[dict[str, Any]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self._event({"delta": {"role": "assistant", "content": ""}, "finish_reason": None}, stream_mode="live")
        for item in entries:
            time.sleep(self.server.token_delay_s)
            self._event({"delta": {"content": item["token"]}, "logprobs": {"content": [item]}, "finish_reason": None})
        self._event({"delta": {}, "finish_reason": "length"})
        self._event(None, usage={"prompt_tokens": 5, "completion_tokens": len(entries),
                                 "total_tokens": 5 + len(entries)})
        self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, choice: dict[str, Any] | None, **extra: Any) -> None:
        doc = {"id": "chatcmpl-drift", "object": "chat.completion.chunk", "model": MODEL,
               "choices": [] if choice is None else [{"index": 0, **choice}], **extra}
        self.wfile.write(f"data: {json.dumps(doc)}\n\n".encode())
        self.wfile.flush()

    def _whole(self, entries: list[dict[str, Any]]) -> None:
        message = {"role": "assistant", "content": "".join(item["token"] for item in entries)}
        choice = {"index": 0, "message": message, "logprobs": {"content": entries}, "finish_reason": "length"}
        self._json(200, {"id": "chatcmpl-drift", "object": "chat.completion", "model": MODEL, "choices": [choice],
                         "usage": {"prompt_tokens": 5, "completion_tokens": len(entries),
                                   "total_tokens": 5 + len(entries)}})


class DriftServer(ThreadingHTTPServer):
    """On 127.0.0.1 (port 0: a free one), served from a thread; a `with` block starts and stops it."""

    daemon_threads = True
    # socketserver's listen backlog is 5: a burst of 16 connections lost the rest to SYN retries (a
    # second each), so a band of 16 formed as batches of 6 to 9 on the board.
    request_queue_size = 128

    # token_delay_s: a reply's tokens must span a clear share of the request (its wait for the
    # batch window included), or the probe reads the stream as buffered and leaves its decode rate
    # unmeasured: at 2 ms, 12 tokens spanned 10-11% of the request against the probe's 10%
    # (liveness.MIN_SPAN_SHARE), and a busy machine tipped the control's S7 to "unmeasured".
    def __init__(self, log_path: Path, drift: float = 1e-3, window_s: float = 0.2,
                 token_delay_s: float = 0.006) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.batcher = Batcher(log_path)
        self.drift, self.window_s, self.token_delay_s = drift, window_s, token_delay_s
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> "DriftServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=10)
