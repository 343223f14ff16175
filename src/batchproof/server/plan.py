"""From a validated request to engine inputs: the checks that need the model, and SamplingParams."""

import re
from dataclasses import dataclass

from batchproof.engine.sampling_params import SamplingParams, SamplingParamsError
from batchproof.server.engine_client import EngineClient
from batchproof.server.errors import APIError
from batchproof.server.protocol import SamplingFields

MAX_STOP_STRINGS = 4
TOKEN_ID_KEY = re.compile(r"-?[0-9]+")  # ASCII digits only: str.isdigit() also takes "²", which int() refuses


@dataclass(frozen=True)
class Plan:
    prompt_ids: list[int]
    params: SamplingParams
    include_usage: bool


def check_model(requested: str | None, served: str) -> None:
    if requested is not None and requested != served:
        raise APIError(404, f"The model '{requested}' does not exist; this server serves '{served}'",
                       param="model", code="model_not_found")


def _stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    strings = [stop] if isinstance(stop, str) else list(stop or [])
    if len(strings) > MAX_STOP_STRINGS:
        raise APIError(400, f"'stop' takes at most {MAX_STOP_STRINGS} strings, got {len(strings)}", param="stop")
    if any(s == "" for s in strings):
        raise APIError(400, f"'stop' strings must not be empty, got {strings!r}", param="stop")
    return tuple(strings)


def _logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float]:
    result = {}
    for key, value in (bias or {}).items():
        if not TOKEN_ID_KEY.fullmatch(key) or not 0 <= int(key) < vocab_size:
            raise APIError(400, f"'logit_bias' key {key!r} is not a token id in 0..{vocab_size - 1}",
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


def plan_request(req: SamplingFields, engine: EngineClient, prompt_ids: list[int], max_tokens: int | None,
                 max_tokens_name: str, top_logprobs: int | None, prompt_logprobs: int | None = None,
                 allow_zero_tokens: bool = False) -> Plan:
    if req.n not in (None, 1):
        raise APIError(400, f"'n' must be 1 (one choice per request), got {req.n}", param="n")
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "'stream_options' is only allowed when 'stream' is true", param="stream_options")
    limit = _max_tokens(max_tokens, max_tokens_name, len(prompt_ids), engine.max_model_len, allow_zero_tokens)
    min_tokens = req.min_tokens or 0
    if min_tokens > limit:
        raise APIError(400, f"'min_tokens' ({req.min_tokens}) must not exceed '{max_tokens_name}' ({limit})",
                       param="min_tokens")
    try:
        params = SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_k=max(req.top_k or 0, 0),  # -1 and 0 both mean off, as in vLLM
            top_p=1.0 if req.top_p is None else req.top_p,
            min_p=req.min_p or 0.0,
            repetition_penalty=req.repetition_penalty or 1.0,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            logit_bias=_logit_bias(req.logit_bias, engine.tokenizer.vocab_size),
            seed=req.seed,
            max_tokens=limit,
            min_tokens=min_tokens,
            stop=_stop_strings(req.stop),
            ignore_eos=bool(req.ignore_eos),
            top_logprobs=top_logprobs,
            prompt_logprobs=prompt_logprobs,
        )
    except SamplingParamsError as e:
        raise APIError(400, str(e), param=e.param) from None
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return Plan(prompt_ids=prompt_ids, params=params, include_usage=include_usage)
