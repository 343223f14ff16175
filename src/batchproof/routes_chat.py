"""POST /v1/chat/completions: parse, plan, submit, and format (streamed or whole)."""

import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response

from batchproof.errors import APIError
from batchproof.openai_format import chat_entry, usage
from batchproof.protocol import ChatCompletionRequest
from batchproof.request_plan import Plan, check_model, plan_request
from batchproof.request_runner import count_mismatch, reply, sse_events, submit
from batchproof.sequence import RequestOutput
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
    request_id, stream = submit(state, plan, "chatcmpl")
    timeout_s = state.config.request_timeout_s
    base = {"id": request_id, "created": int(time.time()), "model": state.served_model_name}
    tokenizer = state.engine.tokenizer
    wants_logprobs = plan.params.top_logprobs is not None

    def whole(outputs: list[RequestOutput]) -> dict:
        last = outputs[-1]
        choice: dict = {"index": 0, "message": {"role": "assistant", "content": "".join(o.text for o in outputs)}}
        if wants_logprobs:
            entries = [chat_entry(tokenizer, r) for o in outputs for r in o.records]
            if len(entries) != last.num_kept_tokens:
                raise count_mismatch(len(entries), last)
            choice["logprobs"] = {"content": entries}
        choice["finish_reason"] = last.finish_reason
        return {**base, "object": "chat.completion", "choices": [choice],
                "usage": usage(last.num_prompt_tokens, last.num_output_tokens)}

    head = {**base, "object": "chat.completion.chunk"}

    def chunk(out: RequestOutput) -> dict:
        choice: dict = {"index": 0, "delta": {"content": out.text} if out.text else {}}
        if wants_logprobs and out.records:  # an entry rides on the chunk that carries its text
            choice["logprobs"] = {"content": [chat_entry(tokenizer, r) for r in out.records]}
        choice["finish_reason"] = out.finish_reason
        return {**head, "choices": [choice]}

    def usage_chunk(out: RequestOutput) -> dict:
        return {**head, "choices": [], "usage": usage(out.num_prompt_tokens, out.num_output_tokens)}

    def events(stream: AsyncIterator[RequestOutput]) -> AsyncIterator[bytes]:
        first = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                      "finish_reason": None}], "stream_mode": "live"}
        return sse_events(stream, timeout_s, wants_logprobs, [first], chunk,
                          usage_chunk if plan.include_usage else None)

    return await reply(request, stream, timeout_s, bool(req.stream), whole, events)
