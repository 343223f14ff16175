"""The request models more than one endpoint takes, strict pydantic (JSON in, no coercion): a
chat message (chat, /tokenize, the tools' prompt), tools and tool_choice (chat, the tools' plan),
response formats (chat, completions, the Responses API's text.format), `metadata`'s limits, and
the fields both completions endpoints add to the sampling fields (sampling_fields.py). Each
endpoint's own request is in its room: chat/protocol.py, completions/protocol.py,
responses/protocol.py, and admin.py's /tokenize and /detokenize."""

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr

from batchproof.server.errors import APIError, shown
from batchproof.server.request.sampling_fields import NumLogprobs, SamplingFields
from batchproof.server.request.unsupported_fields import Strict, refused

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
