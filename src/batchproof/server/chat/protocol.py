"""The chat completions request (`POST /v1/chat/completions`), strict pydantic (JSON in, no
coercion): what it shares with legacy completions and the Responses request is in
request/protocol.py and request/sampling_fields.py."""

from typing import ClassVar, Literal

from pydantic import StrictBool, StrictInt

from batchproof.server.guards.precount import MAX_LISTED_ITEMS
from batchproof.server.request.protocol import (
    MAX_METADATA_PAIRS,
    MAX_TOOLS,
    ChatMessage,
    CompletionsFields,
    NamedToolChoice,
    ResponseFormat,
    StructuredOutputs,
    TokenIds,
    Tool,
)
from batchproof.server.request.sampling_fields import NumLogprobs
from batchproof.server.request.unsupported_fields import NO_TOOLS, Strict, refused


class Continuation(Strict):
    """The previous turn, as its reply gave it (`prompt_token_ids` and a choice's `token_ids`):
    the new prompt must extend prompt + reply exactly (chat/token_space.py)."""

    prompt_token_ids: TokenIds
    token_ids: TokenIds


class ChatCompletionRequest(CompletionsFields):
    # Counted before validation (guards/precount.py); the exact limits are checked where they apply.
    counted_items: ClassVar[dict[str, int]] = {"messages": MAX_LISTED_ITEMS, "tools": MAX_TOOLS,
                                               "metadata": MAX_METADATA_PAIRS,
                                               "prompt_token_ids": MAX_LISTED_ITEMS}
    messages: list[ChatMessage]
    # vLLM's token-in chat: the prompt as ids, with `messages: []` (used as given, no template)
    prompt_token_ids: TokenIds | None = None
    # ours: the previous turn's prompt and reply ids, which this prompt must extend (docs/rl-rollouts.md)
    continue_from: Continuation | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool | None = None
    top_logprobs: NumLogprobs | None = None
    tools: list[Tool] | None = None
    # vLLM's: the generated token ids on each choice, the prompt's beside them (docs/rl-rollouts.md)
    return_token_ids: StrictBool | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None  # default true, as OpenAI's
    # Known and not implemented: a 400 naming the field unless it asks for nothing.
    functions: refused(NO_TOOLS, allowed=([],)) = None
    function_call: refused(NO_TOOLS, allowed=("none",)) = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None  # vLLM's
    modalities: refused("only text", allowed=(["text"],)) = None
    audio: refused("only text") = None
    prediction: refused("predicted outputs are not implemented") = None
    reasoning_effort: refused("the model has no reasoning setting") = None
    verbosity: refused("the model has no verbosity setting") = None
    web_search_options: refused("web search is not implemented") = None
