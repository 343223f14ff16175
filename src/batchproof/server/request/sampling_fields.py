"""The request fields every generating endpoint takes under one name, declared once: chat,
legacy completions and the Responses request all extend `SamplingFields`, and the Responses
translation carries exactly these onto its chat request."""

from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr

from batchproof.server.request.unsupported_fields import Strict

# The upper bound is the server's --max-logprobs, checked when the request is planned.
NumLogprobs = Annotated[StrictInt, Field(ge=0)]
LogprobsMode = Literal["raw", "processed"]
Probability = Annotated[float, Field(gt=0.0, le=1.0)]
Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
# What a seed may be: any int64 or uint64 (the draws take it modulo 2^64: engine/sampling/draws.py).
Seed = Annotated[StrictInt, Field(ge=-(2**63), le=2**64 - 1)]


class SamplingFields(Strict):
    """The model, how to sample and stop, the prefix cache's salt (OpenAI's fields and vLLM's
    extensions), and the bookkeeping fields accepted and ignored."""

    model: StrictStr | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    stop: StrictStr | list[StrictStr] | None = None
    seed: Seed | None = None
    stream: StrictBool | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # batchproof's own: which distribution logprobs describe (default: the server's --logprobs-mode)
    logprobs_mode: LogprobsMode | None = None
    # vLLM's: requests reuse only the cached prefixes of requests with the same salt.
    cache_salt: Annotated[StrictStr, Field(min_length=1, max_length=256)] | None = None
    # Accepted and ignored on purpose (unsupported_fields.IGNORED_FIELDS); the Responses route
    # echoes metadata and user in its response, and store (default true) keeps it.
    user: StrictStr | None = None
    metadata: dict[StrictStr, StrictStr] | None = None
    store: StrictBool | None = None
    service_tier: StrictStr | None = None
    prompt_cache_key: StrictStr | None = None
    safety_identifier: StrictStr | None = None
    # vLLM / llama.cpp extensions
    top_k: Annotated[StrictInt, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0)] | None = None
    ignore_eos: StrictBool | None = None
    min_tokens: Annotated[StrictInt, Field(ge=0)] | None = None
    # ours: a receipt on each choice, to re-execute it anywhere (docs/receipts.md)
    receipt: StrictBool | None = None
    # SGLang's per-request name for vLLM's server-wide --enable-return-routed-experts: an MoE
    # model's routing receipt on each choice (docs/moe.md); a 400 on a dense model
    return_routed_experts: StrictBool | None = None
