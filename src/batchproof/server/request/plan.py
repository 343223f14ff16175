"""From a validated request to engine inputs: the checks that need the model and the server's
limits, and one SamplingParams per choice (a request of P prompts and n choices runs P * n)."""

import dataclasses
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass

from batchproof.engine.model.front import ModelFront
from batchproof.engine.sampling.constraint import Constraint
from batchproof.engine.sampling.params import SamplingParams, SamplingParamsError
from batchproof.engine.text.tokenizer import Tokenizer
from batchproof.server.errors import APIError, shown
from batchproof.server.request.protocol import CompletionsFields

MAX_CHAT_STOP_STRINGS = 4  # OpenAI's limit; lm-eval sends chat at most 4 too
MAX_COMPLETION_STOP_STRINGS = 64  # lm-eval sends a task's whole `until` list to /v1/completions
# Holding back a tail that could still grow into a stop string costs, per held character, a
# comparison against every stop string: quadratic in a stop string's length when a long held
# tail breaks (a 100,000-character string: ~270 us a token on average with one string; a held
# tail of a context's worth of text breaking: seconds on the engine thread).
# 1,024 characters keep it under ~200 us a token even with 64 adversarial strings (measured with
# 16-character tokens), and are far longer than any real stop sequence (lm-eval's are a few words).
MAX_STOP_STRING_CHARS = 1024
MAX_STOP_TOTAL_CHARS = 4 * MAX_STOP_STRING_CHARS  # chat's 4 strings at full length; 64 short ones for lm-eval
# ASCII digits only (str.isdigit() also takes "²", which int() refuses), and few of them: int()
# refuses a string of more than 4,300 digits with a ValueError.
TOKEN_ID_KEY = re.compile(r"-?[0-9]{1,18}")
SEED_MODULUS = 2**64  # a seed read as unsigned, as the draws take it (engine/sampling/draws.py)


@dataclass(frozen=True)
class Limits:
    """The server's settings a plan is checked against."""

    max_batch: int  # the most choices (n) of one prompt
    max_choices: int  # the most engine sequences one request may queue (prompts x n)
    max_logprobs: int
    max_logprob_entries: int
    logprobs_mode: str  # the default when a request does not say
    max_logit_bias: int
    prefix_cache_scope: str = "shared"  # shared, key or salt (ServerConfig.prefix_cache_scope, resolved)


@dataclass(frozen=True)
class Choice:
    index: int  # as the reply numbers it: prompt_index * n + the choice's place among its prompt's
    prompt_index: int
    params: SamplingParams


@dataclass(frozen=True)
class Plan:
    prompts: list[list[int]]
    choices: list[Choice]
    include_usage: bool

    def prompt_ids(self, choice: Choice) -> list[int]:
        return self.prompts[choice.prompt_index]


@dataclass(frozen=True)
class Wanted:
    """What a request asks of the engine beyond sampling, as its route reads its fields."""

    max_tokens: int | None
    max_tokens_name: str
    top_logprobs: int | None  # None: no logprobs
    top_logprobs_name: str
    prompt_logprobs: int | None = None
    prompt_logprobs_name: str = "prompt_logprobs"
    allow_zero_tokens: bool = False
    max_stop_strings: int = MAX_CHAT_STOP_STRINGS
    # vLLM's teacher scoring, checked against the one prompt (completions/named_scoring.py)
    prompt_logprob_token_ids: tuple[tuple[int, ...], ...] | None = None
    prompt_logprob_start: int = 0


def check_model(requested: str | None, served: str) -> None:
    if requested is not None and requested != served:
        raise APIError(404, f"The model {shown(requested)} does not exist; this server serves '{served}'",
                       param="model", code="model_not_found")


def cache_namespace(scope: str, tenant: str | None, salt: str | None) -> str | None:
    """The prefix-cache namespace of a request (SamplingParams.cache_namespace): under `shared`,
    everyone's unless a cache_salt sets it apart (as vLLM); under `key`, also one per API key
    (`tenant`, the key's id); under `salt`, only requests with the same salt share, and one
    without a salt reuses nothing. A guessed prefix from another namespace is never a hit, so
    `cached_tokens` tells a caller nothing about anyone else's prompts."""
    if scope == "salt" and salt is None:
        return None
    parts = [f"salt={salt}" if salt is not None else ""]
    if scope == "key" and tenant is not None:
        parts.append(f"key={tenant}")
    if not any(parts):
        return ""
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def check_text_fits(text: str, tokenizer: Tokenizer, max_tokens: int, where: str, param: str) -> None:
    """Refuse a text of more than max_tokens tokens before paying to tokenize (or render) it."""
    at_least = tokenizer.min_num_tokens(text)
    if at_least > max_tokens:
        raise APIError(400, f"{where} is too long: its {len(text)} characters make at least {at_least} tokens, "
                            f"and {max_tokens} is the most taken here (the model's context or a multiple)",
                       param=param)


def choice_seed(seed: int | None, choice: int) -> int | None:
    """Choice 0 runs with the request's own seed (so n=1 answers as alone); choice j with seed + j,
    as vLLM derives them, wrapped into the 64 bits a generator takes."""
    if seed is None or choice == 0:
        return seed
    return (seed + choice) % SEED_MODULUS


def _stop_strings(stop: str | list[str] | None, limit: int) -> tuple[str, ...]:
    strings = [stop] if isinstance(stop, str) else list(stop or [])
    if len(strings) > limit:
        raise APIError(400, f"'stop' takes at most {limit} strings here, got {len(strings)}", param="stop")
    if any(s == "" for s in strings):
        raise APIError(400, f"'stop' strings must not be empty, got {shown(strings)}", param="stop")
    longest = max(strings, key=len, default="")
    if len(longest) > MAX_STOP_STRING_CHARS:
        raise APIError(400, f"'stop' string {shown(longest)} has {len(longest)} characters; at most "
                            f"{MAX_STOP_STRING_CHARS} are taken", param="stop")
    total = sum(map(len, strings))
    if total > MAX_STOP_TOTAL_CHARS:
        raise APIError(400, f"'stop' strings have {total} characters in all; at most {MAX_STOP_TOTAL_CHARS} "
                            "are taken", param="stop")
    return tuple(strings)


def _logit_bias(bias: dict[str, float] | None, vocab_size: int, max_entries: int) -> dict[int, float]:
    if bias is not None and len(bias) > max_entries:
        raise APIError(400, f"'logit_bias' has {len(bias)} entries; this server takes at most {max_entries} "
                            "(--max-logit-bias)", param="logit_bias")
    result = {}
    for key, value in (bias or {}).items():
        if not TOKEN_ID_KEY.fullmatch(key) or not 0 <= int(key) < vocab_size:
            raise APIError(400, f"'logit_bias' key {shown(key)} is not a token id in 0..{vocab_size - 1}",
                           param="logit_bias")
        result[int(key)] = value
    return result


def _max_tokens(requested: int | None, name: str, prompt_len: int, max_model_len: int, allow_zero: bool) -> int:
    room = max_model_len - prompt_len
    if room < (0 if allow_zero else 1):
        raise APIError(400, f"This model's maximum context length is {max_model_len} tokens, "
                            f"but the prompt has {prompt_len} tokens", param="messages")
    if requested is None:
        return room
    if requested < (0 if allow_zero else 1):
        floor = "0 (with echo)" if allow_zero else "1"
        raise APIError(400, f"'{name}' must be at least {floor}, got {requested}", param=name)
    if prompt_len + requested > max_model_len:
        raise APIError(400, f"This model's maximum context length is {max_model_len} tokens; you asked for "
                            f"{prompt_len + requested} ({prompt_len} in the prompt, {requested} in '{name}')",
                       param=name)
    return requested


def check_sequences(num_prompts: int, requested_n: int | None, limits: Limits) -> int:
    """The request's n, once prompts x n is known to fit the queue: checked before a prompt is
    tokenized, so a list of a million prompts costs its parse and no more."""
    n = 1 if requested_n is None else requested_n
    if not 1 <= n <= limits.max_batch:
        raise APIError(400, f"'n' must be in 1..{limits.max_batch} (the server's --max-batch), got {n}", param="n")
    if num_prompts * n > limits.max_choices:
        raise APIError(400, f"{num_prompts} prompts x n {n} = {num_prompts * n} sequences; this server queues at "
                            f"most {limits.max_choices} (--max-queue)", param="prompt" if num_prompts > 1 else "n")
    return n


def _check_counts(req: CompletionsFields, wanted: Wanted, num_prompts: int, limits: Limits) -> int:
    n = check_sequences(num_prompts, req.n, limits)
    for value, name in ((wanted.top_logprobs, wanted.top_logprobs_name),
                        (wanted.prompt_logprobs, wanted.prompt_logprobs_name)):
        if value is not None and value > limits.max_logprobs:
            raise APIError(400, f"'{name}' is {value}; this server returns at most {limits.max_logprobs} "
                                f"alternatives per token (--max-logprobs {limits.max_logprobs})", param=name)
    return n


def _check_entries(wanted: Wanted, prompts: list[list[int]], limits_per_prompt: list[int], n: int,
                   limits: Limits) -> None:
    """Bound the reply: every logprob entry it could carry, counted before it runs."""
    entries = 0
    for prompt, max_tokens in zip(prompts, limits_per_prompt):
        if wanted.top_logprobs is not None:
            entries += n * max_tokens * (1 + wanted.top_logprobs)
        if wanted.prompt_logprobs is not None:
            entries += len(prompt) * (1 + wanted.prompt_logprobs)
    if entries > limits.max_logprob_entries:
        raise APIError(400, f"this request could return {entries} logprob entries, more than this server's "
                            f"limit of {limits.max_logprob_entries} (--max-logprob-entries); lower "
                            f"'{wanted.max_tokens_name}', '{wanted.top_logprobs_name}' or 'n'",
                       param=wanted.top_logprobs_name if wanted.top_logprobs else wanted.max_tokens_name)


def plan_request(req: CompletionsFields, front: ModelFront, limits: Limits, prompts: list[list[int]],
                 wanted: Wanted, tenant: str | None = None, constraint: Constraint | None = None) -> Plan:
    """`tenant`: the id of the API key that sent the request, if any (its cache namespace);
    `constraint`: what every choice's reply must match (structured.py built and checked it)."""
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "'stream_options' is only allowed when 'stream' is true", param="stream_options")
    if req.stream and wanted.prompt_logprobs is not None and req.prompt_logprobs is not None:
        raise APIError(400, "'prompt_logprobs' is not available with 'stream': true", param="prompt_logprobs")
    if req.return_tail_logprobs and wanted.top_logprobs is None and wanted.prompt_logprobs is None:
        raise APIError(400, "'return_tail_logprobs' adds to logprob entries; ask for them too "
                            f"('{wanted.top_logprobs_name}')", param="return_tail_logprobs")
    n = _check_counts(req, wanted, len(prompts), limits)
    max_tokens = [_max_tokens(wanted.max_tokens, wanted.max_tokens_name, len(p), front.max_model_len,
                              wanted.allow_zero_tokens) for p in prompts]
    _check_entries(wanted, prompts, max_tokens, n, limits)
    min_tokens = req.min_tokens or 0
    if min_tokens > min(max_tokens):
        raise APIError(400, f"'min_tokens' ({req.min_tokens}) must not exceed '{wanted.max_tokens_name}' "
                            f"({min(max_tokens)})", param="min_tokens")
    try:
        base = SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_k=max(req.top_k or 0, 0),  # -1 and 0 both mean off, as in vLLM
            top_p=1.0 if req.top_p is None else req.top_p,
            min_p=req.min_p or 0.0,
            repetition_penalty=req.repetition_penalty or 1.0,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            logit_bias=_logit_bias(req.logit_bias, front.tokenizer.vocab_size, limits.max_logit_bias),
            seed=req.seed,
            max_tokens=max_tokens[0],
            min_tokens=min_tokens,
            stop=_stop_strings(req.stop, wanted.max_stop_strings),
            ignore_eos=bool(req.ignore_eos),
            top_logprobs=wanted.top_logprobs,
            prompt_logprobs=wanted.prompt_logprobs,
            prompt_logprob_token_ids=wanted.prompt_logprob_token_ids,
            prompt_logprob_start=wanted.prompt_logprob_start,
            tail_logprobs=bool(req.return_tail_logprobs),
            logprobs_mode=req.logprobs_mode or limits.logprobs_mode,
            cache_namespace=cache_namespace(limits.prefix_cache_scope, tenant, req.cache_salt),
            constraint=constraint,
            return_routed_experts=bool(req.return_routed_experts),
        )
    except SamplingParamsError as e:
        raise APIError(400, str(e), param=e.param) from None
    choices = []
    for p, limit in enumerate(max_tokens):
        for j in range(n):
            # A prompt is scored once, by its first choice; its siblings share those records.
            params = dataclasses.replace(base, max_tokens=limit, seed=choice_seed(req.seed, j),
                                         prompt_logprobs=base.prompt_logprobs if j == 0 else None)
            choices.append(Choice(index=p * n + j, prompt_index=p, params=params))
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return Plan(prompts=prompts, choices=choices, include_usage=include_usage)


def check_routed_experts(asked: bool | None, engine_info: Callable[[], dict]) -> None:
    """A routing receipt is an MoE model's: asked of a dense one, a 400 naming the field (the
    engine's facts read only when asked)."""
    if not asked:
        return
    info = engine_info()
    if not info.get("num_experts"):
        raise APIError(400, f"'return_routed_experts' asks which experts each token was routed to, and the model "
                            f"served ({info.get('architecture')}) has no mixture-of-experts layers",
                       param="return_routed_experts")


def logprobs_label(params: SamplingParams) -> dict[str, str] | None:
    """What a constrained reply's logprobs object says of itself (docs/api-fields.md): which
    constraint masked the choice, and whether the logprobs are the model's own distribution
    (raw: before the mask) or the one the token was drawn from (processed: masked and
    renormalised over the allowed tokens). None for a free reply (no mask changed anything)."""
    if params.constraint is None:
        return None
    return {"constraint": params.constraint.kind, "logprobs_mode": params.logprobs_mode}
