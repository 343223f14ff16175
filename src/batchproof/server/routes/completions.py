"""POST /v1/completions: the legacy shape, with echo and prompt scoring (max_tokens 0)."""

from fastapi import APIRouter, Request
from fastapi.responses import Response

from batchproof.server.errors import APIError
from batchproof.server.formatting.completions import CompletionsFormatter
from batchproof.server.plan import Plan, check_model, plan_request
from batchproof.server.protocol import CompletionRequest
from batchproof.server.runner import reply, submit
from batchproof.server.state import ServerState, parse_body

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
    formatter = CompletionsFormatter(request_id, state.served_model_name, state.engine.tokenizer, plan.prompt_ids,
                                     wants_records=req.logprobs is not None, echo=bool(req.echo),
                                     include_usage=plan.include_usage)
    return await reply(request, stream, state.config.request_timeout_s, bool(req.stream), formatter)
