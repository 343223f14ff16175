"""A conversation with tool calls and tool results, as the chat template reads it.

A template that reads `tools` (Qwen's, Hermes', Llama 3.1's) gets them as Hugging Face passes
them: the tool list, each assistant call with its arguments as a mapping, each result as a `tool`
message. A template that reads no tools (both packaged models') cannot show them, so the
conversation is spelled in plain turns it does take: the tool definitions in the system
message, an assistant's calls in the form this reply's calls will take (under `auto` the server's
own format, Hermes' <tool_call> blocks, which the system message then teaches; otherwise the
JSON array `required` generates), each result as a `tool` turn where the template prints one as
such (ChatML's, SmolLM2's: where ChatML function-calling data puts results; a small model answers
from a result there, where in a user turn it calls again), else as a user turn (consecutive
results in one turn, so roles still alternate for Gemma).
"""

import json
from typing import Any

from batchproof.server.errors import APIError, shown
from batchproof.server.request.protocol import ChatMessage
from batchproof.server.tools.choice import ToolPlan
from batchproof.server.tools.lazy_grammar import HERMES_CLOSE, HERMES_OPEN

TOOLS_PREAMBLE = "You can call these functions. Their definitions, as JSON:\n"
# Under `auto`, how a call is written (the Hermes format, which the reply's grammar enforces).
CALL_SYNTAX = (f'\n\nTo call a function, write {HERMES_OPEN}{{"name": <the function name>, "arguments": <the '
               f'arguments as a JSON object>}}{HERMES_CLOSE}')
ONE_CALL_OR_MORE = ", one such block per call. Otherwise answer in plain text."
ONE_CALL = ". Call one function at most. Otherwise answer in plain text."
# As deep as the request body itself may nest (pydantic's JSON parser stops near 200), so arguments
# sent as text nest no deeper than a parameters schema could; far below Python's recursion limit,
# which the template's tojson and json.dumps run under.
MAX_ARGUMENTS_DEPTH = 200


def check_roles(messages: list[ChatMessage]) -> None:
    """What each role needs: content, except an assistant turn that made calls; a tool result
    names a call an earlier assistant turn made (a result for no call would be shown to the model
    as the answer to a question it never asked: vLLM and OpenAI refuse it too)."""
    call_ids: set[str] = set()
    for i, message in enumerate(messages):
        where = f"messages.{i}"  # as the request validator spells a path
        if message.role == "tool" and (message.tool_call_id is None or message.content is None):
            raise APIError(400, f"{where}: a 'tool' message needs 'tool_call_id' and 'content'", param="messages")
        if message.role == "tool" and message.tool_call_id not in call_ids:
            raise APIError(400, f"'{where}.tool_call_id' {shown(message.tool_call_id)} answers no call made by an "
                                "earlier assistant turn", param="messages")
        call_ids.update(call.id for call in message.tool_calls or [])
        if message.role != "tool" and message.tool_call_id is not None:
            raise APIError(400, f"{where}: only a 'tool' message takes 'tool_call_id'", param="messages")
        if message.tool_calls and message.role != "assistant":
            raise APIError(400, f"{where}: only an 'assistant' message takes 'tool_calls'", param="messages")
        if message.content is None and not (message.role == "assistant" and message.tool_calls):
            raise APIError(400, f"'{where}.content' is required (only an assistant turn with 'tool_calls' may "
                                "omit it)", param="messages")


def _depth(value: Any) -> int:
    """How deep lists and objects nest in a decoded JSON value (iterative: no recursion to blow)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _arguments(where: str, text: str) -> dict[str, Any]:
    too_deep = APIError(400, f"{where}.function.arguments nest deeper than {MAX_ARGUMENTS_DEPTH} levels",
                        param="messages")
    try:
        arguments = json.loads(text)
    except RecursionError:  # nesting deeper than Python's stack: json.loads recurses per level
        raise too_deep from None
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise APIError(400, f"{where}.function.arguments must be a JSON object as text, got {text[:80]!r}",
                       param="messages")
    # The brackets bound the depth, so most arguments never need the walk.
    if text.count("[") + text.count("{") > MAX_ARGUMENTS_DEPTH and _depth(arguments) > MAX_ARGUMENTS_DEPTH:
        raise too_deep
    return arguments


def _call_names(messages: list[ChatMessage]) -> dict[str, str]:
    return {call.id: call.function.name for m in messages for call in (m.tool_calls or [])}


def _native(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    names = _call_names(messages)
    dicts = []
    for i, message in enumerate(messages):
        one: dict[str, Any] = message.for_template()
        if message.tool_calls:
            one["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.function.name,
                                               "arguments": _arguments(f"messages.{i}.tool_calls.{j}",
                                                                       c.function.arguments)}}
                                 for j, c in enumerate(message.tool_calls)]
        if message.role == "tool":
            one |= {"tool_call_id": message.tool_call_id, "name": names.get(message.tool_call_id, "")}
        dicts.append(one)
    return dicts


def _spelled_calls(calls: list[dict[str, Any]], is_auto: bool) -> str:
    if is_auto:
        return "\n".join(f"{HERMES_OPEN}{json.dumps(c, ensure_ascii=False)}{HERMES_CLOSE}" for c in calls)
    return json.dumps(calls, ensure_ascii=False)


def _spelled(messages: list[ChatMessage], tool_plan: ToolPlan | None, shows_tool_role: bool) -> list[dict[str, Any]]:
    names = _call_names(messages)
    is_auto = tool_plan is not None and tool_plan.mode == "auto"
    dicts: list[dict[str, Any]] = []
    # Consecutive results (parallel calls') make one user turn, joined once at its end: adding
    # each to the turn's text would copy the growing text every time (quadratic in their number).
    results: list[str] = []
    for i, message in enumerate(messages):
        one: dict[str, Any] = message.for_template()
        if message.role == "tool" and shows_tool_role:
            dicts.append({"role": "tool", "content": one["content"]})
            continue
        if message.role == "tool":
            name = names.get(message.tool_call_id, "a function")
            results.append(f"Result of {name} (call {message.tool_call_id}):\n{one['content']}")
            if i + 1 == len(messages) or messages[i + 1].role != "tool":
                dicts.append({"role": "user", "content": "\n\n".join(results)})
                results = []
            continue
        if message.tool_calls:
            calls = [{"name": c.function.name, "arguments": _arguments(f"messages.{i}.tool_calls.{j}",
                                                                       c.function.arguments)}
                     for j, c in enumerate(message.tool_calls)]
            one["content"] = "\n".join(filter(None, [one["content"], _spelled_calls(calls, is_auto)]))
        dicts.append(one)
    if tool_plan is not None and tool_plan.makes_calls:
        described = TOOLS_PREAMBLE + json.dumps(tool_plan.tools, ensure_ascii=False)
        if is_auto:
            described += CALL_SYNTAX + (ONE_CALL_OR_MORE if tool_plan.is_parallel else ONE_CALL)
        if dicts and dicts[0]["role"] == "system":
            dicts[0] = {**dicts[0], "content": dicts[0]["content"] + "\n\n" + described}
        else:
            dicts.insert(0, {"role": "system", "content": described})
    return dicts


def template_messages(messages: list[ChatMessage], tool_plan: ToolPlan | None, is_native: bool,
                      shows_tool_role: bool = False) -> list[dict[str, Any]]:
    """`shows_tool_role`: the template prints a `tool` turn as such (formats.shows_tool_role)."""
    check_roles(messages)
    return _native(messages) if is_native else _spelled(messages, tool_plan, shows_tool_role)
