"""SGLang's native `/generate` in front of our `/v1/completions`, so SGLang's own test scripts run
against our server unchanged: a list of prompts becomes that many concurrent completions (so they
batch as SGLang's one request does), and the replies come back in SGLang's shape."""

import asyncio
import threading
import time
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


def completion_body(prompt: str | list[int], params: dict[str, Any]) -> dict[str, Any]:
    """One SGLang prompt (text or token ids) and its sampling_params as our completions request."""
    body = {"prompt": prompt, "max_tokens": params.get("max_new_tokens", 128),
            "temperature": params.get("temperature", 1.0), "logprobs": 1, "return_token_ids": True}
    if params.get("sampling_seed") is not None:
        body["seed"] = params["sampling_seed"]
    for name in ("frequency_penalty", "presence_penalty"):
        if params.get(name):
            body[name] = params[name]
    return body


def sglang_reply(completion: dict[str, Any], index: int) -> dict[str, Any]:
    """Our completion as SGLang's: text, output ids, and `output_token_logprobs` as [logprob, id, text]."""
    choice = completion["choices"][0]
    ids, logprobs = choice["token_ids"], choice["logprobs"]
    entries = [[lp, token_id, text] for lp, token_id, text in zip(logprobs["token_logprobs"], ids, logprobs["tokens"])]
    usage = completion["usage"]
    return {"text": choice["text"], "output_ids": ids, "index": index,
            "meta_info": {"id": completion["id"], "finish_reason": {"type": choice["finish_reason"]},
                          "prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"],
                          "output_token_logprobs": entries}}


def build_app(upstream: str) -> Starlette:
    async def generate(request: Request) -> JSONResponse:
        body = await request.json()
        if body.get("stream"):
            return JSONResponse({"error": "the shim does not stream"}, status_code=400)
        prompts = body["text"] if "text" in body else body["input_ids"]
        is_batch = isinstance(prompts, list) and bool(prompts) and not isinstance(prompts[0], int)
        batch = prompts if is_batch else [prompts]
        params = body.get("sampling_params") or {}
        async with httpx.AsyncClient(base_url=upstream, timeout=600) as client:
            sent = [client.post("/v1/completions", json=completion_body(p, params)) for p in batch]
            responses = await asyncio.gather(*sent)  # all in flight at once: one batch on our server
        for response in responses:
            if response.status_code != 200:
                return JSONResponse(response.json(), status_code=response.status_code)
        replies = [sglang_reply(response.json(), i) for i, response in enumerate(responses)]
        return JSONResponse(replies if is_batch else replies[0])

    async def flush_cache(request: Request) -> JSONResponse:
        # Nothing to flush for the test's sake: our prefix cache gives bitwise the bits of
        # computing afresh (tests/engine/test_prefix_cache.py), which is what a flush ensures.
        return JSONResponse({"flushed": True})

    return Starlette(routes=[Route("/generate", generate, methods=["POST"]),
                             Route("/flush_cache", flush_cache, methods=["POST", "GET"])])


class SglangShim:
    """The shim on 127.0.0.1 in a thread, for a `with` block; `port` is where SGLang's scripts point."""

    def __init__(self, upstream: str) -> None:
        config = uvicorn.Config(build_app(upstream), host="127.0.0.1", port=0, log_level="error", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self.port = 0

    def __enter__(self) -> "SglangShim":
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the SGLang shim did not start")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
