"""A loopback OpenAI-style SSE server that the probe tests script: tokens, batching, sources."""

import argparse
import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from batchproof.common.wire import REPLICA_HEADER

MODEL = "fake-model"
BUCKETS = [*range(1, 17), 24, 32, 48, 64, 128]


@dataclass(frozen=True)
class Token:
    """One generated token: text, exact bytes, its logprob and the runner-up's."""

    text: str
    token_bytes: list[int]
    logprob: float = -0.1
    alt_text: str = " alt"
    alt_logprob: float = -2.0


def plain(request_no: int, m: int, step: int) -> Token:
    """A distinct word per step, the same for every request at any m."""
    text = f" w{step}"
    return Token(text, list(text.encode()))


def frozen_when_batched(request_no: int, m: int, step: int) -> Token:
    """Batched slots repeat one token from step 2 on: the frozen-slot signature."""
    return Token(" same", list(b" same")) if m > 1 and step >= 2 else plain(request_no, m, step)


def near_tie_flip(at: int, margin: float) -> Callable[[int, int, int], Token]:
    """At step `at` the top two are `margin` apart; batched slots take the runner-up."""

    def pick(request_no: int, m: int, step: int) -> Token:
        if step < at:
            return plain(request_no, m, step)
        if step == at:
            best, second = Token(" yes", list(b" yes"), -0.69, " no", -0.69 - margin), Token(
                " no", list(b" no"), -0.69 - margin, " yes", -0.69
            )
            return second if m > 1 else best
        text = f" b{step}" if m > 1 else f" w{step}"
        return Token(text, list(text.encode()))

    return pick


def unstable_alone(request_no: int, m: int, step: int) -> Token:
    """The second request ever served parts from the first at step 1."""
    if request_no == 1 and step >= 1:
        return Token(f" x{step}", list(f" x{step}".encode()))
    return plain(request_no, m, step)


def split_character(request_no: int, m: int, step: int) -> Token:
    """Steps 3 and 4 are the two bytes of 'é': step 3 carries no text, its entry is held."""
    if step == 3:
        return Token("\ufffd", [0xC3])
    if step == 4:
        return Token("\ufffd", [0xA9])
    return plain(request_no, m, step)


@dataclass
class Script:
    """How the fake behaves; every field has the well-behaved default."""

    pick: Callable[[int, int, int], Token] = plain
    max_batch: int = 16  # 1: never batches
    window_s: float = 0.05  # an admitted request waits this long for its burst
    token_delay_s: float = 0.002
    entry_style: Literal["ours", "openai", "llamacpp"] = "ours"
    stream_mode: str | None = "live"
    log_path: Path | None = None
    log_spelling: str = "batch m={m} done in {ms}ms ({rate} tok/s/slot)"
    has_histogram: bool = False
    histogram_label: str | None = None  # e.g. 'model="m"': no series before the first batch
    slots_style: Literal["is_processing", "state"] | None = None
    has_llama_gauge: bool = False
    has_server_info: bool = True
    record_delay_s: float = 0.0  # a batch is recorded this long after it finishes
    short_by: int = 0  # generate this many fewer tokens than asked
    status: int = 200  # answer every completion with this status when not 200
    drop_request: int | None = None  # this request's stream ends after 3 tokens, without usage
    is_buffered: bool = False  # generate the whole reply, then send it in one write
    # From this step on, in a batch of different prompts, the request with the longest prompt
    # takes other tokens (with a wide margin): a server that is invariant only for identical batches.
    mixed_divergence_at: int | None = None
    # Batched logprobs move by this much (tokens unchanged): a batch-variant reduction order.
    batched_logprob_shift: float = 0.0
    # A fleet: request i goes to replicas[i % len] (round robin), each replica batching on its own
    # and counted in its own histogram series (label `replica`); every reply names its replica
    # in the x-batchproof-replica header. () sends no header, as servers other than ours.
    replicas: tuple[str, ...] = ()
    listed_replicas: tuple[str, ...] | None = None  # /v1/server_info's fleet.replicas (None: no `fleet` key)
    # (replica, step, shift): that replica's logprobs at that step move by `shift`, at any m (tokens
    # unchanged): a replica that is self-consistent and batch-invariant, but not bitwise the others.
    replica_logprob_shift: tuple[str, int, float] | None = None
    # (replica, seconds): that replica's batches are recorded this much later than the others'
    # (a fleet's replicas report their histograms each on its own clock).
    replica_record_lag: tuple[str, float] | None = None


@dataclass
class State:
    script: Script
    requests: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)
    active: int = 0
    active_prompts: list[str] = field(default_factory=list)
    batch_max: int = 0
    batch_start: float = 0.0
    batches: list[int] = field(default_factory=list)
    histogram: dict[float, int] = field(default_factory=dict)
    semaphore: asyncio.Semaphore | None = None
    fleet: dict[str, "State"] = field(default_factory=dict)  # each replica's own batching
    replica: str | None = None  # the replica this state batches for, on a fleet

    def admit(self) -> None:
        if self.active == 0:
            self.batch_start = time.perf_counter()
        self.active += 1
        self.batch_max = max(self.batch_max, self.active)

    def leave(self) -> None:
        self.active -= 1
        if self.active == 0:
            m, ms = self.batch_max, (time.perf_counter() - self.batch_start) * 1000
            self.batch_max = 0
            lag = self.script.replica_record_lag
            delay = self.script.record_delay_s + (lag[1] if lag is not None and lag[0] == self.replica else 0.0)
            asyncio.get_running_loop().call_later(delay, self.record, m, ms)

    def record(self, m: int, ms: float) -> None:
        self.batches.append(m)
        for bound in [*BUCKETS, float("inf")]:
            if m <= bound:
                self.histogram[bound] = self.histogram.get(bound, 0) + 1
        if self.script.log_path is not None:
            line = self.script.log_spelling.format(m=m, ms=round(ms), rate=12.5)
            with self.script.log_path.open("a", encoding="utf-8") as log:
                log.write(f"INFO {line}\n")


def entry(token: Token, style: str, step: int) -> dict[str, Any]:
    if style == "llamacpp":
        return {"id": 1000 + step, "token": token.text, "logprob": token.logprob, "bytes": token.token_bytes}
    top = [
        {"token": token.text, "logprob": token.logprob, "bytes": token.token_bytes},
        {"token": token.alt_text, "logprob": token.alt_logprob, "bytes": list(token.alt_text.encode())},
    ]
    if style == "openai":
        top = [{**t, "bytes": None} for t in top] + [{"token": "?", "logprob": -9999.0, "bytes": None}]
        return {"token": token.text, "logprob": None if step == 0 else token.logprob, "bytes": None,
                "top_logprobs": top}
    return {"token": token.text, "logprob": token.logprob, "bytes": token.token_bytes, "top_logprobs": top}


def chunk(choice: dict[str, Any] | None, **extra: Any) -> str:
    body = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": MODEL,
            "choices": [] if choice is None else [{"index": 0, **choice}], **extra}
    return f"data: {json.dumps(body)}\n\n"


def legacy_chunk(text: str, entries: list[dict[str, Any]], finish: str | None) -> str:
    """A /v1/completions chunk: text, and the legacy parallel-lists logprobs."""
    logprobs = {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e.get("top_logprobs", [])} for e in entries],
        "text_offset": [0 for _ in entries],
    }
    choice = {"index": 0, "text": text, "logprobs": logprobs if entries else None, "finish_reason": finish}
    body = {"id": "cmpl-fake", "object": "text_completion", "model": MODEL, "choices": [choice]}
    return f"data: {json.dumps(body)}\n\n"


def shifted(token: Token, shift: float) -> Token:
    return Token(token.text, token.token_bytes, token.logprob - shift, token.alt_text, token.alt_logprob - shift)


def adjusted(script: Script, token: Token, m: int, step: int, is_mixed: bool, is_longest: bool) -> Token:
    """The token after the script's batch effects: a mixed-batch divergence, shifted logprobs."""
    if script.mixed_divergence_at is not None and is_mixed and is_longest and step >= script.mixed_divergence_at:
        text = f" m{step}"
        token = Token(text, list(text.encode()))
    if m > 1 and script.batched_logprob_shift:
        token = shifted(token, script.batched_logprob_shift)
    return token


async def generate(
    state: State, request_no: int, max_tokens: int, prompt: str, route: str, replica: str | None = None
) -> AsyncIterator[str]:
    if state.script.is_buffered:
        # Everything is generated first; the reply leaves in one write at the end.
        whole = [part async for part in _generate(state, request_no, max_tokens, prompt, route, replica)]
        yield "".join(whole)
        return
    async for part in _generate(state, request_no, max_tokens, prompt, route, replica):
        yield part


async def _generate(
    state: State, request_no: int, max_tokens: int, prompt: str, route: str, replica: str | None
) -> AsyncIterator[str]:
    script = state.script
    assert state.semaphore is not None
    async with state.semaphore:
        state.admit()
        state.active_prompts.append(prompt)
        try:
            await asyncio.sleep(script.window_s)
            m = state.active
            is_mixed = len(set(state.active_prompts)) > 1
            is_longest = len(prompt) == max(len(p) for p in state.active_prompts)
            extra = {"stream_mode": script.stream_mode} if script.stream_mode else {}
            yield chunk({"delta": {"role": "assistant", "content": ""}, "finish_reason": None}, **extra)
            held: list[dict[str, Any]] = []
            pending = b""
            n = max_tokens - script.short_by
            for step in range(n):
                await asyncio.sleep(script.token_delay_s)
                token = adjusted(script, script.pick(request_no, m, step), m, step, is_mixed, is_longest)
                if script.replica_logprob_shift is not None and script.replica_logprob_shift[:2] == (replica, step):
                    token = shifted(token, script.replica_logprob_shift[2])
                if request_no == script.drop_request and step == 3:
                    return
                held.append(entry(token, script.entry_style, step))
                pending += bytes(token.token_bytes)
                try:
                    text = pending.decode("utf-8")
                except UnicodeDecodeError:
                    continue  # an incomplete character: no text yet, its entry waits
                pending = b""
                if route == "completions":
                    yield legacy_chunk(text, held, None)
                else:
                    yield chunk({"delta": {"content": text}, "logprobs": {"content": held}, "finish_reason": None})
                held = []
            if route == "completions":
                yield legacy_chunk("", held, "length")
            else:
                yield chunk({"delta": {}, "logprobs": {"content": held} if held else None, "finish_reason": "length"})
            yield chunk(None, usage={"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n})
            yield "data: [DONE]\n\n"
        finally:
            state.active_prompts.remove(prompt)
            state.leave()


def histogram_lines(state: State) -> list[str]:
    """The batch-size histogram as prometheus_client writes it; on a fleet one series per replica
    (a replica's appears with its first batch)."""
    lines = ["# HELP batchproof_batch_size sequences per batch", "# TYPE batchproof_batch_size histogram"]
    if state.fleet:
        return lines + [line for replica, sub in state.fleet.items() if sub.batches
                        for line in series_lines(sub, f'replica="{replica}"')]
    label = state.script.histogram_label
    if label is not None and not state.batches:
        return lines
    return lines + series_lines(state, label)


def series_lines(state: State, label: str | None) -> list[str]:
    lines = []
    extra = f"{label}," if label else ""
    plain = f"{{{label}}}" if label else ""
    for bound in [*BUCKETS, float("inf")]:
        le = "+Inf" if bound == float("inf") else str(float(bound))
        lines.append(f'batchproof_batch_size_bucket{{{extra}le="{le}"}} {state.histogram.get(bound, 0)}.0')
    lines.append(f"batchproof_batch_size_count{plain} {len(state.batches)}.0")
    lines.append(f"batchproof_batch_size_sum{plain} {sum(state.batches)}.0")
    return lines


def build_app(script: Script) -> tuple[Starlette, State]:
    state = State(script)
    state.fleet = {replica: State(script, replica=replica) for replica in script.replicas}

    async def completions(request: Request) -> Response:
        body = await request.json()
        route = "chat" if request.url.path.endswith("/chat/completions") else "completions"
        prompt = body["messages"][0]["content"] if route == "chat" else body["prompt"]
        state.requests.append(body)
        state.authorizations.append(request.headers.get("authorization"))
        request_no = len(state.requests) - 1
        replica = script.replicas[request_no % len(script.replicas)] if script.replicas else None
        batcher = state.fleet[replica] if replica is not None else state
        if batcher.semaphore is None:
            batcher.semaphore = asyncio.Semaphore(script.max_batch)
        if script.status != 200:
            error = {"message": "logprobs: not on this path", "type": "server_error", "param": None}
            return JSONResponse({"error": error}, status_code=script.status)
        if "model" in body and body["model"] != MODEL:
            return JSONResponse({"error": {"message": f"model {body['model']!r}"}}, status_code=404)
        stream = generate(batcher, request_no, int(body["max_tokens"]), prompt, route, replica)
        headers = {REPLICA_HEADER: replica} if replica is not None else None
        return StreamingResponse(stream, media_type="text/event-stream", headers=headers)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def server_info(request: Request) -> Response:
        if not script.has_server_info:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        info: dict[str, Any] = {"max_batch": script.max_batch, "dtype": "float32", "version": "fake"}
        if script.listed_replicas is not None:
            info["numerics_id"] = "fake-numerics"
            info["fleet"] = {"replicas": [
                {"id": r, "host": "fake-host", "decode_path": "fake", "build_sha256": "0" * 64,
                 "numerics_id": "fake-numerics", "alive": True}
                for r in script.listed_replicas
            ]}
        return JSONResponse(info)

    async def metrics(request: Request) -> Response:
        lines = ["# HELP fake_requests_total requests", "# TYPE fake_requests_total counter",
                 f"fake_requests_total {len(state.requests)}.0"]
        if script.has_histogram:
            lines += histogram_lines(state)
        if script.has_llama_gauge:
            lines += [
                "# TYPE llamacpp:requests_processing gauge",
                f"llamacpp:requests_processing {state.active}",
            ]
        if len(lines) == 3 and not script.has_histogram:
            return PlainTextResponse("metrics disabled", status_code=501)
        return PlainTextResponse("\n".join(lines) + "\n")

    async def slots(request: Request) -> Response:
        if script.slots_style is None:
            return JSONResponse({"error": {"message": "slots endpoint disabled"}}, status_code=501)
        if script.slots_style == "state":
            return JSONResponse([{"id": i, "state": int(i < state.active)} for i in range(16)])
        return JSONResponse([{"id": i, "is_processing": i < state.active} for i in range(16)])

    routes = [
        Route("/v1/chat/completions", completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models),
        Route("/v1/server_info", server_info),
        Route("/metrics", metrics),
        Route("/slots", slots),
    ]
    return Starlette(routes=routes), state


class ScriptedServer:
    """Run the scripted app with uvicorn on 127.0.0.1 in a thread, for a `with` block."""

    def __init__(self, script: Script) -> None:
        self.app, self.state = build_app(script)
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=0, log_level="error", lifespan="off", http="h11"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self.url = ""

    def __enter__(self) -> "ScriptedServer":
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the scripted server did not start")
            time.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


SMALL_MATRIX = """\
protocol:
  n_predict: 12
  sampler: {temperature: 0.0, seed: 0, ignore_eos: true}
ladder:
  declared: [1, 4]
witness:
  min_agree_tokens: 6
  max_constant_run: 4
"""


def closed_port_url() -> str:
    """A loopback URL nothing listens on: connecting to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def run_probe(url: str, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any] | None]:
    """`batchproof probe` with the small matrix and a witness in tmp_path: (exit code, witness)."""
    from batchproof.commands import probe

    matrix = tmp_path / "matrix.yaml"
    if not matrix.exists():
        matrix.write_text(SMALL_MATRIX)
    witness = tmp_path / "witness.json"
    witness.unlink(missing_ok=True)
    parser = argparse.ArgumentParser()
    probe.add_arguments(parser)
    argv = ["--url", url, "--matrix", str(matrix), "--witness", str(witness), "--settle", "1", *extra]
    code = probe.run(parser.parse_args(argv))
    return code, json.loads(witness.read_text()) if witness.exists() else None
