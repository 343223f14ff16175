"""A Responses request as the chat request it means: input items become chat messages,
`text.format` becomes `response_format`, flat function tools become chat tools. Chat's plan
(chat/plan.py) then plans it, so sampling, stopping, masks and logprobs have one implementation."""

from typing import Any

from pydantic import BaseModel, ValidationError

from batchproof.server.chat.protocol import ChatCompletionRequest
from batchproof.server.errors import APIError, shown
from batchproof.server.request.sampling_fields import SamplingFields
from batchproof.server.request.unsupported_fields import IGNORED_FIELDS
from batchproof.server.responses.protocol import (
    LOGPROBS_INCLUDE,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    MessageItem,
    NamedFunctionChoice,
    ResponsesRequest,
)
from batchproof.server.tools.choice import check_num_tools

TEXT_PARTS = ("input_text", "output_text")
# Chat's spelling of a field -> the Responses one, for the errors the chat route's checks raise.
RENAMED = (("response_format.json_schema.schema", "text.format.schema"), ("response_format.json_schema", "text.format"),
           ("response_format", "text.format"), ("max_completion_tokens", "max_output_tokens"), ("messages", "input"))
# Chat request fields a Responses request sets under the same name: the shared fields both
# requests extend (the bookkeeping ones stay with the Responses request, which echoes and stores
# by them), and parallel_tool_calls, the one tool field spelled alike.
SAME_FIELDS = (*(name for name in SamplingFields.model_fields if name not in IGNORED_FIELDS), "parallel_tool_calls")

Message = dict[str, Any]  # a chat message, as ChatCompletionRequest reads it


def _validated(model: type[BaseModel], raw: dict[str, Any], where: str) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        place = f"{where}.{field}" if field else where
        if first["type"] == "extra_forbidden":
            raise APIError(400, f"'{place}' is not a field batchproof supports here (see docs/api-fields.md)",
                           param=where.split("[")[0]) from None
        raise APIError(400, f"invalid value {shown(first.get('input'))} for '{place}': {first['msg']}",
                       param=where.split("[")[0]) from None


def _text(content: str | list[dict[str, Any]], where: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise APIError(400, f"'{where}.content[{j}]' of type {shown(kind)} is not served: only text parts "
                                f"({', '.join(TEXT_PARTS)}) are read", param="input")
        texts.append(part["text"])
    return "".join(texts)


def input_messages(items: str | list[dict[str, Any]], where: str = "input") -> list[Message]:
    """Input items, in order, as chat messages: a function call joins the assistant turn before
    it (a response's text, then its calls, is one assistant turn); its output is a tool message."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[Message] = []
    for i, raw in enumerate(items):
        at = f"{where}[{i}]"
        kind = raw.get("type", "message")
        if kind == "message":
            item = _validated(MessageItem, raw, at)
            messages.append({"role": item.role, "content": _text(item.content, at)})
        elif kind == "function_call":
            item = _validated(FunctionCallItem, raw, at)
            function = {"name": item.name, "arguments": item.arguments}
            call = {"id": item.call_id, "type": "function", "function": function}
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            item = _validated(FunctionCallOutputItem, raw, at)
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output, at)})
        else:
            raise APIError(400, f"'{at}.type' {shown(kind)} is not served: input items are messages, function_call "
                                "and function_call_output (built-in tools and reasoning items need OpenAI's servers)",
                           param="input")
    return messages


def _tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    check_num_tools(len(tools))  # before each is validated
    chat_tools = []
    for i, raw in enumerate(tools):
        if raw.get("type") != "function":
            raise APIError(400, f"'tools[{i}].type' {shown(raw.get('type'))} is not served: only function tools run "
                                "here (built-in tools such as web_search need OpenAI's servers)", param="tools")
        tool = _validated(FunctionTool, raw, f"tools[{i}]")
        chat_tools.append({"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True,
                                                                            by_alias=True)})
    return chat_tools


def _tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") != "function":
        raise APIError(400, f"'tool_choice' of type {shown(choice.get('type'))} is not served: use 'none', 'auto', "
                            "'required' or {\"type\": \"function\", \"name\": ...}", param="tool_choice")
    named = _validated(NamedFunctionChoice, choice, "tool_choice")
    return {"type": "function", "function": {"name": named.name}}


def _response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    text_format = req.text.format if req.text is not None else None
    if text_format is None or text_format.type != "json_schema":
        return None if text_format is None else {"type": text_format.type}
    if text_format.schema_ is None:
        raise APIError(400, "'text.format' of type 'json_schema' needs its 'schema'", param="text.format.schema")
    if text_format.name is None:
        raise APIError(400, "'text.format' of type 'json_schema' needs its 'name'", param="text.format.name")
    return {"type": "json_schema", "json_schema": text_format.as_json_schema().model_dump(by_alias=True,
                                                                                          exclude_none=True)}


def _wants_logprobs(req: ResponsesRequest) -> bool:
    for value in req.include or []:
        if value != LOGPROBS_INCLUDE:
            raise APIError(400, f"'include' value {shown(value)} is not served: the only one produced here is "
                                f"{LOGPROBS_INCLUDE!r}", param="include")
    wanted = LOGPROBS_INCLUDE in (req.include or [])
    if req.top_logprobs is not None and not wanted:
        raise APIError(400, f"'top_logprobs' ({req.top_logprobs}) returns logprobs only with 'include': "
                            f"[{LOGPROBS_INCLUDE!r}]; add it", param="top_logprobs")
    return wanted


TOKEN_PROMPT = "token_prompt"  # the key marking a stored conversation whose prompt was sent as ids


def token_prompt_marker(num_tokens: int) -> Message:
    """What a token-in response keeps in place of the messages it never had: a later
    previous_response_id cannot re-render ids, so it is refused (route.py) rather than
    continued from the reply alone."""
    return {TOKEN_PROMPT: num_tokens}


def _check_token_prompt(req: ResponsesRequest) -> None:
    """The ids are the whole prompt: nothing else may add to it."""
    if req.input:
        raise APIError(400, f"'input' must be [] when 'prompt_token_ids' is given (the ids are the whole prompt), "
                            f"got {shown(req.input)}", param="input")
    for name, value in (("instructions", req.instructions), ("previous_response_id", req.previous_response_id)):
        if value is not None:
            raise APIError(400, f"'{name}' cannot be combined with 'prompt_token_ids' (the ids are the whole prompt)",
                           param=name)


def chat_request(req: ResponsesRequest, history: list[Message]) -> tuple[ChatCompletionRequest, list[Message]]:
    """The chat request a Responses request means, after `history` (a stored conversation that
    previous_response_id continues; its instructions are not carried over, as OpenAI's are not),
    and the conversation it continues with (history + this input, without the instructions)."""
    conversation = [*history, *input_messages(req.input)]
    body: dict[str, Any] = {name: getattr(req, name) for name in SAME_FIELDS if getattr(req, name) is not None}
    system = [{"role": "system", "content": req.instructions}] if req.instructions is not None else []
    body["messages"] = [*system, *conversation]
    if req.prompt_token_ids is not None:
        _check_token_prompt(req)
        body["prompt_token_ids"] = req.prompt_token_ids
        conversation = [token_prompt_marker(len(req.prompt_token_ids))]
    if req.max_output_tokens is not None:
        body["max_completion_tokens"] = req.max_output_tokens
    if _wants_logprobs(req):
        body |= {"logprobs": True, "top_logprobs": req.top_logprobs or 0}
    if req.tools is not None:
        body["tools"] = _tools(req.tools)
    if req.tool_choice is not None:
        body["tool_choice"] = _tool_choice(req.tool_choice)
    response_format = _response_format(req)
    if response_format is not None:
        body["response_format"] = response_format
    try:
        return ChatCompletionRequest.model_validate(body), conversation
    except ValidationError as e:  # the items were checked one by one: what is left is a message's shape
        raise renamed(APIError(400, f"invalid input: {e.errors()[0]['msg']}", param="input")) from None


def renamed(error: APIError) -> APIError:
    """An error of the chat route's checks, spelled with the Responses API's field names."""
    message, param = error.message, error.param
    for chat_name, name in RENAMED:
        message = message.replace(f"'{chat_name}", f"'{name}")
        if param is not None and (param == chat_name or param.startswith(chat_name + ".")):
            param = name + param[len(chat_name):]
    if param in ("logprobs",):
        param = "include"
    error.message, error.param = message, param
    error.args = (message,)
    return error
