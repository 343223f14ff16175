"""The legacy completions request (`POST /v1/completions`), strict pydantic (JSON in, no
coercion): what it shares with chat is in request/protocol.py and request/sampling_fields.py."""

from typing import Annotated, ClassVar

from pydantic import Field, StrictBool, StrictInt, StrictStr

from batchproof.server.guards.precount import MAX_LISTED_ITEMS
from batchproof.server.request.protocol import (
    MAX_METADATA_PAIRS,
    CompletionsFields,
    ResponseFormat,
    StructuredOutputs,
    TokenIds,
)
from batchproof.server.request.sampling_fields import NumLogprobs
from batchproof.server.request.unsupported_fields import refused


class CompletionRequest(CompletionsFields):
    counted_items: ClassVar[dict[str, int]] = {"prompt": MAX_LISTED_ITEMS, "metadata": MAX_METADATA_PAIRS,
                                               "prompt_logprob_token_ids": MAX_LISTED_ITEMS}
    # A string, strings, token ids, or lists of token ids: one choice (or n) per prompt.
    prompt: StrictStr | list[StrictStr] | TokenIds | list[TokenIds]
    logprobs: NumLogprobs | None = None
    echo: StrictBool | None = None
    return_token_ids: StrictBool | None = None  # vLLM's: each choice's prompt and generated token ids
    # vLLM's teacher scoring: per prompt row from prompt_logprob_start, the ids to score (-1 pads)
    prompt_logprob_token_ids: list[list[StrictInt]] | None = None
    prompt_logprob_start: Annotated[StrictInt, Field(ge=0)] | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None  # vLLM's
    best_of: refused("best_of above 1 is not implemented; use n", allowed=(1,)) = None
    suffix: refused("insertion (suffix) is not implemented", allowed=("",)) = None
