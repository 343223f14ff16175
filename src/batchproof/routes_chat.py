"""POST /v1/chat/completions: parse, plan, submit, and format (streamed or whole)."""

import contextlib
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from batchproof.errors import APIError
from batchproof.openai_format import SSE_DONE, chat_entry, sse, usage
from batchproof.protocol import ChatCompletionRequest
from batchproof.request_plan import Plan, check_model, plan_request
from batchproof.request_runner import (CLIENT_GONE, admit, collect, count_mismatch, deltas, engine_error,
                                      new_request_id)
from batchproof.server_state import ServerState, parse_body

router = APIRouter()


def _plan(req: ChatCompletionRequest, state: ServerState) -> Plan:
    check_model(req.model, state.served_model_name)
    if not req.messages:
        raise APIError(400, "'messages' must hold at least one message, got []", param="messages")
    if req.top_logprobs is not None and req.logprobs is not True:
        raise APIError(400, f"'top_logprobs' ({req.top_logprobs}) requires 'logprobs' to be true, "
                            f"got 'logprobs': {req.logprobs}", param="top_logprobs")
    engine = state.engine
    messages = [m.for_template() for m in req.messages]
    prompt_ids = engine.chat_prompt_ids(messages)
    max_tokens, name = ((req.max_completion_tokens, "max_completion_tokens") if req.max_completion_tokens is not None
                        else (req.max_tokens, "max_tokens"))
    top_logprobs = (req.top_logprobs or 0) if req.logprobs else None
    return plan_request(req, engine, prompt_ids, max_tokens, name, top_logprobs)


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(request: Request) -> Response:
    state: ServerState = request.app.state.server
    req = parse_body(ChatCompletionRequest, await request.body())
    plan = _plan(req, state)
    admit(state.async_engine, state.config.max_queue)
    request_id = new_request_id("chatcmpl")
    wants_logprobs = plan.params.top_logprobs is not None
    stream = deltas(state.async_engine, state.metrics, request_id, plan, state.config.request_timeout_s)
    base = {"id": request_id, "created": int(time.time()), "model": state.served_model_name}
    if req.stream:
        return StreamingResponse(_sse(stream, base, plan, wants_logprobs, state), media_type="text/event-stream")
    try:
        outputs = await collect(request, stream)
    except TimeoutError:
        raise APIError(504, f"request timed out after {state.config.request_timeout_s:g} s",
                       type_="timeout_error") from None
    if outputs is None:
        return Response(status_code=CLIENT_GONE)
    return JSONResponse(_whole_reply(outputs, base, wants_logprobs, state))


def _whole_reply(outputs: list, base: dict, wants_logprobs: bool, state: ServerState) -> dict:
    last = outputs[-1]
    error = engine_error(last, state.config.request_timeout_s)
    if error is not None:
        raise error
    choice: dict = {"index": 0, "message": {"role": "assistant", "content": "".join(o.text for o in outputs)}}
    if wants_logprobs:
        entries = [chat_entry(state.engine.tokenizer, r) for o in outputs for r in o.records]
        if len(entries) != last.num_kept_tokens:
            raise count_mismatch(len(entries), last)
        choice["logprobs"] = {"content": entries}
    choice["finish_reason"] = last.finish_reason
    return {**base, "object": "chat.completion", "choices": [choice],
            "usage": usage(last.num_prompt_tokens, last.num_output_tokens)}


async def _sse(stream: AsyncIterator, base: dict, plan: Plan, wants_logprobs: bool,
               state: ServerState) -> AsyncIterator[bytes]:
    chunk = {**base, "object": "chat.completion.chunk"}
    first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    yield sse({**chunk, "choices": [first], "stream_mode": "live"})
    num_entries = 0
    try:
        async with contextlib.aclosing(stream):
            async for out in stream:
                error = engine_error(out, state.config.request_timeout_s)
                if error is not None:
                    yield sse(error.body())  # an error event and no [DONE]: the reply is incomplete
                    return
                entries = [chat_entry(state.engine.tokenizer, r) for r in out.records] if wants_logprobs else []
                num_entries += len(entries)
                if out.finish_reason is not None and wants_logprobs and num_entries != out.num_kept_tokens:
                    yield sse(count_mismatch(num_entries, out).body())
                    return
                if not out.text and out.finish_reason is None:
                    continue
                choice: dict = {"index": 0, "delta": {"content": out.text} if out.text else {}}
                if entries:
                    choice["logprobs"] = {"content": entries}
                choice["finish_reason"] = out.finish_reason
                yield sse({**chunk, "choices": [choice]})
                last = out
    except TimeoutError:
        error = APIError(504, f"request timed out after {state.config.request_timeout_s:g} s", type_="timeout_error")
        yield sse(error.body())
        return
    if plan.include_usage:
        yield sse({**chunk, "choices": [], "usage": usage(last.num_prompt_tokens, last.num_output_tokens)})
    yield SSE_DONE
