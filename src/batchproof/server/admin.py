"""The small routes: models, health, metrics, tokenize, detokenize (and their request models),
server_info, and 501s. The trainer's routes (load_weights, the control plane, the notary) are in trainer/."""

import time
from typing import ClassVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import StrictBool, StrictInt, StrictStr
from starlette.concurrency import run_in_threadpool

from batchproof.server.chat.messages import render_chat
from batchproof.server.errors import APIError
from batchproof.server.guards.auth import tenant
from batchproof.server.guards.precount import MAX_LISTED_ITEMS
from batchproof.server.info import server_info, tokenizer_facts
from batchproof.server.reply.json_body import json_reply
from batchproof.server.reply.receipt_facts import template_sha256, tokenizer_sha256
from batchproof.server.request.plan import check_model
from batchproof.server.request.protocol import ChatMessage
from batchproof.server.request.unsupported_fields import Strict
from batchproof.server.state import ServerState, parse_body

router = APIRouter()

# OpenAI routes we do not serve: a clear 501 naming the path, never a silent 404 or a
# 200 that lacks logprobs.
# /tokenize takes texts of up to 1 MiB (lm-eval's rolling log-likelihoods tokenize whole
# documents; tokenizing 1 MiB takes ~0.8 s and ~270 MB) and /detokenize up to this many
# contexts' worth of ids: bounded work on a worker thread.
MAX_TOKENIZE_BYTES = 2**20
TOKENIZE_CONTEXTS = 16
NOT_IMPLEMENTED = ["/v1/embeddings", "/v1/moderations", "/v1/images/generations",
                   "/v1/audio/speech", "/v1/audio/transcriptions", "/v1/edits"]


class TokenizeRequest(Strict):
    """vLLM's /tokenize (and llama.cpp's `content`)."""

    counted_items: ClassVar[dict[str, int]] = {"messages": MAX_LISTED_ITEMS}

    model: StrictStr | None = None
    prompt: StrictStr | None = None
    content: StrictStr | None = None  # llama.cpp's name for prompt
    messages: list[ChatMessage] | None = None
    add_generation_prompt: StrictBool = True
    # As vLLM: the tokenizer's BOS for a prompt (default true); for messages the template writes it (false)
    add_special_tokens: StrictBool | None = None
    return_token_strs: StrictBool = False


class DetokenizeRequest(Strict):
    model: StrictStr | None = None
    tokens: list[StrictInt]


def _state(request: Request) -> ServerState:
    return request.app.state.server


@router.get("/health")
async def health(request: Request) -> Response:
    """Only the status, open to anyone: ok, degraded (steps failed, their requests got errors,
    the others went on), failed (the model did not load, or the engine stopped), loading. What
    went wrong is told to an API key's holder only (it can name files and settings)."""
    state = _state(request)
    backend = state.backend
    failure = backend.failure if backend is not None else None
    if state.load_error is not None or failure is not None:
        status, code = "failed", 503
    elif backend is None:
        return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": "1"})
    else:
        status, code = ("degraded" if backend.num_faults else "ok"), 200
    body = {"status": status}
    if tenant(request) is not None and status != "ok":
        body |= _what_went_wrong(state)
    return JSONResponse(body, status_code=code)


def _what_went_wrong(state: ServerState) -> dict:
    backend = state.backend
    if backend is None:
        return {"error": state.load_error}
    failure = backend.failure
    return {"faults": backend.num_faults, "last_fault": backend.last_fault,
            "error": None if failure is None else f"{type(failure).__name__}: {failure}"}


@router.get("/v1/models")
async def models(request: Request) -> dict:
    state = _state(request)
    return {"object": "list", "data": [{"id": state.served_model_name, "object": "model",
                                        "created": int(time.time()), "owned_by": "batchproof",
                                        "max_model_len": state.front.max_model_len}]}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = _state(request)
    backend = state.backend
    if backend is not None:
        state.metrics.queue_depth.set(backend.num_waiting)
        state.metrics.running.set(backend.num_running)
        state.metrics.free_slots.set(backend.num_free_slots)
        state.metrics.prefix_cache.cache = state.client.prefix_cache
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


@router.post("/tokenize")
async def tokenize(request: Request) -> Response:
    # A megabyte's ids and token strings are a reply of megabytes: built and encoded off the loop.
    state, body = _state(request), await request.body()
    return await json_reply(lambda: _tokenize(state, body))


def _tokenize(state: ServerState, body: bytes) -> dict:
    """As vLLM's: add_special_tokens (the tokenizer's BOS) defaults to true for a prompt and to
    false for messages, whose template writes its own. On a worker thread."""
    req = parse_body(TokenizeRequest, body)
    check_model(req.model, state.model_name)
    client = state.client
    if req.messages is not None:
        text = render_chat(client, req.messages, req.add_generation_prompt)
    elif req.prompt is not None or req.content is not None:
        text = req.prompt if req.prompt is not None else req.content
        param = "prompt" if req.prompt is not None else "content"
        if len(text.encode("utf-8", errors="surrogatepass")) > MAX_TOKENIZE_BYTES:
            raise APIError(400, f"'{param}' is longer than the {MAX_TOKENIZE_BYTES} bytes /tokenize takes",
                           param=param)
    else:
        raise APIError(400, "give 'prompt' (or 'content') or 'messages'", param="prompt")
    add_special = req.add_special_tokens if req.add_special_tokens is not None else req.messages is None
    tokenizer = client.front.tokenizer
    tokens = tokenizer.encode(text, add_bos=tokenizer.ids.add_bos and add_special)
    reply = {"tokens": tokens, "count": len(tokens), "max_model_len": client.front.max_model_len, "token_strs": None}
    if req.return_token_strs:
        reply["token_strs"] = [tokenizer.token_text(t) for t in tokens]
    return reply


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request) -> dict:
    """What vLLM's /tokenizer_info gives and lm-eval's remote tokenizer reads."""
    front = _state(request).front
    source = None if front.chat_template is None else front.chat_template.source
    return tokenizer_facts(front.tokenizer, source, front.max_model_len)


@router.post("/detokenize")
async def detokenize(request: Request) -> dict:
    return await run_in_threadpool(_detokenize, _state(request), await request.body())


def _detokenize(state: ServerState, body: bytes) -> dict:
    """Parsing a list of up to 16 contexts of ids and decoding them: on a worker thread."""
    req = parse_body(DetokenizeRequest, body)
    check_model(req.model, state.model_name)
    front = state.front
    vocab = front.tokenizer.vocab_size
    most = TOKENIZE_CONTEXTS * front.max_model_len
    if len(req.tokens) > most:
        raise APIError(400, f"'tokens' holds {len(req.tokens)} ids; this server detokenizes at most {most} "
                            f"({TOKENIZE_CONTEXTS} contexts)", param="tokens")
    bad = [t for t in req.tokens if not 0 <= t < vocab]
    if bad:
        raise APIError(400, f"'tokens' holds id {bad[0]}, outside 0..{vocab - 1}", param="tokens")
    return {"prompt": front.tokenizer.decode(req.tokens)}


@router.get("/v1/server_info")
async def info(request: Request) -> dict:
    state = _state(request)
    config = state.config
    settings = {"max_queue": config.max_queue, "request_timeout_s": config.request_timeout_s,
                "api_key_required": state.api_key_required, "logprobs_mode": config.logprobs_mode,
                "max_logprobs": config.max_logprobs, "max_logprob_entries": config.max_logprob_entries,
                "max_logit_bias": config.max_logit_bias, "max_request_mb": config.max_request_mb,
                "prefix_cache_scope": state.prefix_cache_scope, "receipts": config.receipts}
    front = state.front
    # What a receipt names besides the weights and numerics (docs/receipts.md): a verifier over
    # --url reads them here. (The tokenizer's hash is computed once, off the loop.)
    hashes = {"tokenizer_sha256": await run_in_threadpool(tokenizer_sha256, front.tokenizer),
              "chat_template_sha256": template_sha256(front.chat_template)}
    return {**server_info(state.client.info(), state.served_model_name, settings), **hashes}


async def not_implemented(request: Request) -> Response:
    path = request.url.path
    raise APIError(501, f"{request.method} {path} is not implemented by batchproof: it cannot compute logprobs "
                        "there; use /v1/chat/completions or /v1/completions", type_="not_implemented_error")


for _path in NOT_IMPLEMENTED:
    router.add_api_route(_path, not_implemented, methods=["GET", "POST"], include_in_schema=False)
