"""POST /v1/completions: the legacy shape, with echo, prompt scoring (max_tokens 0) and every
prompt shape OpenAI allows (a string, strings, token ids, lists of token ids)."""

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from batchproof.server.auth import tenant
from batchproof.server.errors import APIError
from batchproof.server.formatting.completions import CompletionsFormatter, CompletionsShape
from batchproof.server.plan import (
    MAX_COMPLETION_STOP_STRINGS,
    Plan,
    Wanted,
    check_model,
    check_sequences,
    check_text_fits,
    logprobs_label,
    plan_request,
)
from batchproof.server.protocol import CompletionRequest, check_metadata
from batchproof.server.serving import reply, submit
from batchproof.server.state import ServerState, parse_body
from batchproof.server.structured import request_constraint

router = APIRouter()
LEGACY_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this route


def _prompts(req: CompletionRequest, state: ServerState) -> list[list[int]]:
    """Token ids per prompt: text is tokenized (with the model's BOS if it wants one); ids are
    used as given, so echoed entries line up one to one with the ids sent."""
    prompt = req.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
    if not prompt:
        raise APIError(400, "'prompt' must not be empty, got []", param="prompt")
    check_sequences(len(prompt), req.n, state.limits)  # before any prompt is tokenized
    front = state.front
    tokenizer = front.tokenizer
    prompts = []
    for i, one in enumerate(prompt):
        where = "'prompt'" if len(prompt) == 1 else f"'prompt[{i}]'"
        if isinstance(one, str):
            check_text_fits(one, tokenizer, front.max_model_len, where, "prompt")
            ids = tokenizer.encode(one, add_bos=tokenizer.ids.add_bos)
        else:
            bad = [t for t in one if not 0 <= t < tokenizer.vocab_size]
            if bad:
                raise APIError(400, f"{where} token id {bad[0]} is outside 0..{tokenizer.vocab_size - 1}",
                               param="prompt")
            ids = list(one)
        if not ids:
            raise APIError(400, f"{where} must not be empty", param="prompt")
        if len(ids) > front.max_model_len:  # at once: the next prompts are not tokenized for nothing
            raise APIError(400, f"{where} has {len(ids)} tokens; this model's maximum context length is "
                                f"{front.max_model_len} tokens", param="prompt")
        prompts.append(ids)
    return prompts


def _plan(body: bytes, state: ServerState, key_id: str | None) -> tuple[CompletionRequest, Plan]:
    """Parse and tokenize: on a worker thread (a maximal body takes seconds)."""
    req = parse_body(CompletionRequest, body)
    check_model(req.model, state.served_model_name)
    check_metadata(req.metadata)
    prompts = _prompts(req, state)
    if req.max_tokens == 0 and not req.echo:
        raise APIError(400, "'max_tokens' 0 is only allowed with 'echo': true (prompt scoring)", param="max_tokens")
    if req.echo and req.stream:  # (None means false for both)
        raise APIError(400, "'echo' is not supported with 'stream': true", param="echo")
    max_tokens = LEGACY_DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    # echo with logprobs scores the prompt too; prompt_logprobs asks for it on its own.
    asked = [k for k in (req.logprobs if req.echo else None, req.prompt_logprobs) if k is not None]
    wanted = Wanted(max_tokens, "max_tokens", req.logprobs, "logprobs",
                    prompt_logprobs=max(asked) if asked else None, allow_zero_tokens=bool(req.echo),
                    max_stop_strings=MAX_COMPLETION_STOP_STRINGS)
    constraint = request_constraint(req.response_format, req.structured_outputs, state.front.tokenizer)
    return req, plan_request(req, state.front, state.limits, prompts, wanted, key_id, constraint)


@router.post("/v1/completions", response_model=None)
async def completions(request: Request) -> Response:
    state: ServerState = request.app.state.server
    req, plan = await run_in_threadpool(_plan, await request.body(), state, tenant(request))
    submitted = await submit(state, plan, "cmpl")
    shape = CompletionsShape(num_logprobs=req.logprobs, echo=bool(req.echo),
                             num_prompt_logprobs=req.prompt_logprobs, include_usage=plan.include_usage,
                             label=logprobs_label(plan.choices[0].params),
                             return_token_ids=bool(req.return_token_ids))
    formatter = CompletionsFormatter(submitted.request_id, state.served_model_name, state.front.tokenizer,
                                     plan.prompts, len(plan.choices) // len(plan.prompts), shape)
    return await reply(request, submitted, state.config.request_timeout_s, bool(req.stream), formatter)
