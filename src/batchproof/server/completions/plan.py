"""Legacy completions' plan: every prompt shape OpenAI allows (a string, strings, token ids, lists
of token ids) as token ids, echo and prompt scoring (max_tokens 0) checked, and what the engine runs."""

from batchproof.server.completions.named_scoring import named_rows
from batchproof.server.completions.protocol import CompletionRequest
from batchproof.server.errors import APIError
from batchproof.server.request.plan import (
    MAX_COMPLETION_STOP_STRINGS,
    Plan,
    Wanted,
    check_model,
    check_routed_experts,
    check_sequences,
    check_text_fits,
    plan_request,
)
from batchproof.server.request.protocol import check_metadata
from batchproof.server.request.structured import request_constraint
from batchproof.server.state import ServerState

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


def plan_completions(req: CompletionRequest, state: ServerState, key_id: str | None) -> Plan:
    """A parsed completions request -> what the engine runs: P prompts x n choices."""
    check_model(req.model, state.model_name)
    check_metadata(req.metadata)
    check_routed_experts(req.return_routed_experts, state.client.info)
    prompts = _prompts(req, state)
    if req.max_tokens == 0 and not req.echo:
        raise APIError(400, "'max_tokens' 0 is only allowed with 'echo': true (prompt scoring)", param="max_tokens")
    if req.echo and req.stream:  # (None means false for both)
        raise APIError(400, "'echo' is not supported with 'stream': true", param="echo")
    max_tokens = LEGACY_DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    # echo with logprobs scores the prompt too; prompt_logprobs asks for it on its own.
    asked = [k for k in (req.logprobs if req.echo else None, req.prompt_logprobs) if k is not None]
    named, start = named_rows(req, prompts, state.front.tokenizer.vocab_size, state.limits.max_logprobs)
    if named is not None and not asked:  # named rows are prompt scoring's rows
        asked = [0]
    wanted = Wanted(max_tokens, "max_tokens", req.logprobs, "logprobs",
                    prompt_logprobs=max(asked) if asked else None, allow_zero_tokens=bool(req.echo),
                    max_stop_strings=MAX_COMPLETION_STOP_STRINGS, prompt_logprob_token_ids=named,
                    prompt_logprob_start=start)
    constraint = request_constraint(req.response_format, req.structured_outputs, state.front.tokenizer)
    return plan_request(req, state.front, state.limits, prompts, wanted, key_id, constraint)
