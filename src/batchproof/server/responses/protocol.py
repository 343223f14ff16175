"""The Responses API's request, as strict pydantic models: what we honour typed, what we do not
refused by name (docs/api-fields.md lists every field and what happens to it)."""

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr

from batchproof.server.guards.precount import MAX_LISTED_ITEMS
from batchproof.server.request.protocol import MAX_METADATA_PAIRS, MAX_TOOLS, JsonSchemaFormat
from batchproof.server.request.sampling_fields import NumLogprobs, SamplingFields
from batchproof.server.request.unsupported_fields import Strict, refused

LOGPROBS_INCLUDE = "message.output_text.logprobs"
ONLY_TEXT = "only text content is served"


class InputText(Strict):
    type: Literal["input_text"]
    text: StrictStr


class OutputText(Strict):
    """An assistant's earlier text, as a client echoes a response's output back."""

    type: Literal["output_text"]
    text: StrictStr
    annotations: list[Any] | None = None  # accepted and ignored: we write none
    logprobs: list[Any] | None = None  # accepted and ignored: the history is re-read, not re-scored


# Other content parts (images, files, audio, refusals) are refused by name in translate.py.
ContentPart = dict[StrictStr, Any]


class MessageItem(Strict):
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[ContentPart]
    id: StrictStr | None = None  # an echoed output message's own id
    status: StrictStr | None = None
    phase: StrictStr | None = None


class FunctionCallItem(Strict):
    """A call the model made earlier (a response's `function_call` output, echoed back)."""

    type: Literal["function_call"]
    call_id: StrictStr
    name: StrictStr
    arguments: StrictStr
    id: StrictStr | None = None
    status: StrictStr | None = None
    logprobs: list[Any] | None = None  # ours, echoed back (the call's tokens' entries): accepted and ignored


class FunctionCallOutputItem(Strict):
    """The client's result for a call."""

    type: Literal["function_call_output"]
    call_id: StrictStr
    output: StrictStr | list[ContentPart]
    id: StrictStr | None = None
    status: StrictStr | None = None


class FunctionTool(Strict):
    type: Literal["function"]
    name: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: StrictStr | None = None
    parameters: dict[StrictStr, Any] | None = None
    strict: StrictBool | None = None  # accepted either way: arguments are always generated under the schema


class NamedFunctionChoice(Strict):
    type: Literal["function"]
    name: StrictStr


class TextFormat(Strict):
    """`text.format`: Chat's response_format, with the json_schema's fields spelled flat."""

    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")] | None = None
    description: StrictStr | None = None
    schema_: dict[StrictStr, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None

    def as_json_schema(self) -> JsonSchemaFormat:
        return JsonSchemaFormat.model_validate({"name": self.name or "response", "description": self.description,
                                                "schema": self.schema_, "strict": self.strict})


class TextConfig(Strict):
    format: TextFormat | None = None
    verbosity: refused("the model has no verbosity setting") = None


class ResponsesStreamOptions(Strict):
    include_obfuscation: StrictBool | None = None  # accepted and ignored: no obfuscation padding is written


class ResponsesRequest(SamplingFields):
    # The shared fields (request/sampling_fields.py: the model, sampling and stopping, the salt; metadata
    # and user echoed in the response, store keeping it) and the Responses API's own. (A comment,
    # not a docstring: a docstring would become the OpenAPI document's description.)
    # Counted before validation (guards/precount.py); the exact limits are checked where they apply.
    counted_items: ClassVar[dict[str, int]] = {"input": MAX_LISTED_ITEMS, "tools": MAX_TOOLS,
                                               "metadata": MAX_METADATA_PAIRS,
                                               "prompt_token_ids": MAX_LISTED_ITEMS}
    input: StrictStr | list[dict[StrictStr, Any]]  # items are read one by one (translate.py), to name the bad one
    # Token-in, as chat's (vLLM's shape): the rendered prompt as ids, with `input: []`
    prompt_token_ids: list[StrictInt] | None = None
    instructions: StrictStr | None = None
    max_output_tokens: StrictInt | None = None
    top_logprobs: NumLogprobs | None = None
    include: list[StrictStr] | None = None
    text: TextConfig | None = None
    tools: list[dict[StrictStr, Any]] | None = None  # each read in translate.py: a function, or refused by type
    tool_choice: Literal["none", "auto", "required"] | dict[StrictStr, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    stream_options: ResponsesStreamOptions | None = None
    previous_response_id: StrictStr | None = None
    # Accepted and ignored on purpose, as the shared ones (unsupported_fields.IGNORED_FIELDS)
    prompt_cache_retention: StrictStr | None = None
    # Known and not served: a 400 naming the field unless it asks for nothing.
    background: refused("background responses are not served; send the request and wait", allowed=(False,)) = None
    conversation: refused("conversations are not stored; use previous_response_id") = None
    reasoning: refused("the model has no reasoning setting", allowed=({},)) = None
    prompt: refused("stored prompt templates are not served") = None
    truncation: refused("the input is never truncated; a context overflow is a 400", allowed=("disabled",)) = None
    max_tool_calls: refused("a cap on tool calls is not implemented; use parallel_tool_calls") = None
    context_management: refused("context management is not implemented") = None
    moderation: refused("moderation is not implemented") = None
    image: refused(ONLY_TEXT) = None
    background_options: refused("background responses are not served") = None
    prompt_cache_options: refused("prompt caching is automatic here (the prefix cache)") = None
    access_programs: refused("not served") = None
