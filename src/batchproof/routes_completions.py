"""POST /v1/completions: the legacy shape, with echo and prompt scoring (max_tokens 0)."""

import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response

from batchproof.errors import APIError
from batchproof.openai_format import TextOffsets, legacy_logprobs, usage
from batchproof.protocol import CompletionRequest
from batchproof.request_plan import Plan, check_model, plan_request
from batchproof.request_runner import count_mismatch, reply, sse_events, submit
from batchproof.sequence import RequestOutput
from batchproof.server_state import ServerState, parse_body

router = APIRouter()
LEGACY_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this route


def _prompt_ids(req: CompletionRequest, state: ServerState) -> list[int]:
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise APIError(400, f"'prompt' as a list of strings must hold exactly one string, got {len(prompt)}",
                           param="prompt")
        prompt = prompt[0]
    tokenizer = state.engine.tokenizer
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt, add_bos=tokenizer.ids.add_bos)
    else:
        bad = [i for i in prompt if not 0 <= i < tokenizer.vocab_size]
        if bad:
            raise APIError(400, f"'prompt' token id {bad[0]} is outside 0..{tokenizer.vocab_size - 1}", param="prompt")
        ids = list(prompt)
    if not ids:
        raise APIError(400, "'prompt' must not be empty", param="prompt")
    return ids


def _plan(req: CompletionRequest, state: ServerState) -> Plan:
    check_model(req.model, state.served_model_name)
    prompt_ids = _prompt_ids(req, state)
    if req.max_tokens == 0 and not req.echo:
        raise APIError(400, "'max_tokens' 0 is only allowed with 'echo': true (prompt scoring)", param="max_tokens")
    if req.echo and req.stream:  # (None means false for both)
        raise APIError(400, "'echo' is not supported with 'stream': true", param="echo")
    max_tokens = LEGACY_DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    prompt_logprobs = req.logprobs if req.echo and req.logprobs is not None else None
    return plan_request(req, state.engine, prompt_ids, max_tokens, "max_tokens", req.logprobs,
                        prompt_logprobs=prompt_logprobs, allow_zero_tokens=bool(req.echo))


@router.post("/v1/completions", response_model=None)
async def completions(request: Request) -> Response:
    state: ServerState = request.app.state.server
    req = parse_body(CompletionRequest, await request.body())
    plan = _plan(req, state)
    request_id, stream = submit(state, plan, "cmpl")
    timeout_s = state.config.request_timeout_s
    base = {"id": request_id, "object": "text_completion", "created": int(time.time()),
            "model": state.served_model_name}
    tokenizer = state.engine.tokenizer
    wants_logprobs = req.logprobs is not None

    def whole(outputs: list[RequestOutput]) -> dict:
        last = outputs[-1]
        prefix = tokenizer.decode(plan.prompt_ids) if req.echo else ""
        choice: dict = {"index": 0, "text": prefix + "".join(o.text for o in outputs),
                        "finish_reason": last.finish_reason, "logprobs": None}
        if wants_logprobs:
            records = [r for o in outputs for r in o.records]
            if len(records) != last.num_kept_tokens:
                raise count_mismatch(len(records), last)
            token_ids = [r.token_id for r in records]
            scored: list = []
            if req.echo:
                scored = outputs[0].prompt_records or [None] * len(plan.prompt_ids)
                token_ids = plan.prompt_ids + token_ids
            choice["logprobs"] = legacy_logprobs(tokenizer, scored + records, token_ids, TextOffsets(tokenizer))
        return {**base, "choices": [choice], "usage": usage(last.num_prompt_tokens, last.num_output_tokens)}

    offsets = TextOffsets(tokenizer)  # one running count of characters across the chunks

    def chunk(out: RequestOutput) -> dict:
        choice: dict = {"index": 0, "text": out.text, "finish_reason": out.finish_reason, "logprobs": None}
        if wants_logprobs:
            choice["logprobs"] = legacy_logprobs(tokenizer, out.records, [r.token_id for r in out.records], offsets)
        return {**base, "choices": [choice]}

    def usage_chunk(out: RequestOutput) -> dict:
        return {**base, "choices": [], "usage": usage(out.num_prompt_tokens, out.num_output_tokens)}

    def events(stream: AsyncIterator[RequestOutput]) -> AsyncIterator[bytes]:
        return sse_events(stream, timeout_s, wants_logprobs, [], chunk, usage_chunk if plan.include_usage else None)

    return await reply(request, stream, timeout_s, bool(req.stream), whole, events)
