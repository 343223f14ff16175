"""The chat, completions, tokenize and detokenize request models, strict pydantic (JSON in, no
coercion): what they share with the Responses request is in sampling_fields.py."""

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr

from batchproof.server.errors import APIError, shown
from batchproof.server.precount import MAX_LISTED_ITEMS
from batchproof.server.sampling_fields import NumLogprobs, SamplingFields
from batchproof.server.unsupported_fields import NO_TOOLS, Strict, refused

TokenIds = list[StrictInt]
# OpenAI's limits on `metadata` (the same on every route): a few tags, not a store; the Responses
# route keeps it with the response, so without them one request could park megabytes there.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
MAX_TOOLS = 128  # OpenAI's limit on one request's tools


def check_metadata(metadata: dict[str, str] | None) -> None:
    """A 400 naming `metadata` past OpenAI's limits (a 400, as OpenAI's, not a type error's 422)."""
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_PAIRS:
        raise APIError(400, f"'metadata' has {len(metadata)} pairs; at most {MAX_METADATA_PAIRS} are taken",
                       param="metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise APIError(400, f"'metadata' key {shown(key)} has {len(key)} characters; at most "
                                f"{MAX_METADATA_KEY_CHARS} are taken", param="metadata")
        if len(value) > MAX_METADATA_VALUE_CHARS:
            raise APIError(400, f"'metadata.{key}' has {len(value)} characters; at most "
                                f"{MAX_METADATA_VALUE_CHARS} are taken", param="metadata")


class TextPart(Strict):
    type: Literal["text"]
    text: StrictStr


class FunctionCall(Strict):
    name: StrictStr
    arguments: StrictStr  # a JSON object, as text (OpenAI's shape)


class ToolCall(Strict):
    """An assistant's earlier call, as a client echoes it back in the history."""

    id: StrictStr
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # None only on an assistant turn that made tool calls (checked in tools/prompt.py).
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None  # accepted and ignored: chat templates do not read it
    tool_calls: list[ToolCall] | None = None  # an assistant's calls
    tool_call_id: StrictStr | None = None  # a tool result: the call it answers
    function_call: refused("the legacy `function_call` is not implemented; use `tool_calls`") = None
    refusal: refused("refusals are not produced") = None

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def for_template(self) -> dict[str, str]:
        """As the chat template reads it: OpenAI's `developer` role is the system prompt."""
        return {"role": "system" if self.role == "developer" else self.role, "content": self.text()}


class FunctionDef(Strict):
    name: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: StrictStr | None = None
    parameters: dict[StrictStr, Any] | None = None  # a JSON schema of the arguments (absent: no arguments)
    strict: StrictBool | None = None  # accepted either way: the arguments are always generated under the schema


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Strict):
    name: StrictStr


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(Strict):
    """OpenAI's response_format.json_schema."""

    name: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: StrictStr | None = None
    # `schema` shadows a BaseModel attribute: stored as schema_, spelled `schema` on the wire.
    schema_: dict[StrictStr, Any] | None = Field(default=None, alias="schema")
    # Accepted either way: every schema we take is enforced whole (what OpenAI's strict
    # promises); one we cannot enforce is refused, strict or not.
    strict: StrictBool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(Strict):
    """vLLM's structured_outputs (one of these): a JSON schema, any JSON object, a regex, one
    of a list of strings, or a grammar (Lark, or llama.cpp's GBNF)."""

    json_: dict[StrictStr, Any] | StrictStr | None = Field(default=None, alias="json")  # `json` shadows BaseModel's
    json_object: StrictBool | None = None
    regex: StrictStr | None = None
    choice: list[StrictStr] | None = None
    grammar: StrictStr | None = None
    # vLLM's other keys: refused by name (the engine would not honour them).
    structural_tag: refused("structural tags are not implemented") = None
    disable_any_whitespace: refused("JSON is always written without free whitespace here", allowed=(True,)) = None
    disable_additional_properties: refused("the schema's own additionalProperties is enforced") = None
    whitespace_pattern: refused("JSON is always written without free whitespace here") = None


class StreamOptions(Strict):
    include_usage: StrictBool = False
    include_obfuscation: StrictBool | None = None  # accepted and ignored: padding against side channels


class Continuation(Strict):
    """The previous turn, as its reply gave it (`prompt_token_ids` and a choice's `token_ids`):
    the new prompt must extend prompt + reply exactly (chat/token_space.py)."""

    prompt_token_ids: TokenIds
    token_ids: TokenIds


class CompletionsFields(SamplingFields):
    """What both completions endpoints (chat and legacy) add to the shared fields: a token budget,
    n choices, logit_bias, prompt logprobs and stream options (the Responses request has its own
    budget and stream options, and none of the rest)."""

    max_tokens: StrictInt | None = None
    n: StrictInt | None = None  # null means the default, as OpenAI reads it
    stream_options: StreamOptions | None = None
    logit_bias: dict[StrictStr, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    prompt_logprobs: NumLogprobs | None = None  # vLLM's: each prompt token's logprob and top K
    # ours: each logprob entry also carries the logprob of the mass outside its top_logprobs
    return_tail_logprobs: StrictBool | None = None
    # vLLM's: each logprob entry's token (and alternatives) spelled `token_id:N`
    return_tokens_as_token_ids: StrictBool | None = None


class ChatCompletionRequest(CompletionsFields):
    # Counted before validation (precount.py); the exact limits are checked where they apply.
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


class TokenizeRequest(Strict):
    """vLLM's /tokenize (and llama.cpp's `content`)."""

    counted_items: ClassVar[dict[str, int]] = {"messages": MAX_LISTED_ITEMS}

    model: StrictStr | None = None
    prompt: StrictStr | None = None
    content: StrictStr | None = None  # llama.cpp's name for prompt
    messages: list[ChatMessage] | None = None
    add_generation_prompt: StrictBool = True
    # As vLLM: the tokenizer's BOS for a prompt (default true); for messages the template writes it (false)
    add_special_tokens: StrictBool | None = None
    return_token_strs: StrictBool = False


class DetokenizeRequest(Strict):
    model: StrictStr | None = None
    tokens: list[StrictInt]
