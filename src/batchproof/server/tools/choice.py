"""What a request's `tools` and `tool_choice` ask of the engine, decided once per request:

- `none` (or no tools): a plain reply; the tools are still shown to a template that reads them.
- `auto`: the model writes text or calls, in the format its template teaches (formats.py) or, where
  the template reads no tools, in the Hermes format the server teaches it (tools/prompt.py); the
  reply is generated under that format's lazy grammar (lazy_grammar.py: free text, and any call it
  begins is a call of an offered function whose arguments match its schema), and read back from it.
- `required`: the reply is generated under the grammar of a JSON array of calls, each one of the
  tools with arguments that match its parameters' schema (at most one if not parallel_tool_calls).
- a named function: the reply is generated under the grammar of that function's parameters: it
  is the call's arguments.
"""

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from batchproof.engine.grammar import compile as grammars
from batchproof.engine.sampling.constraint import Constraint
from batchproof.engine.text.chat_template import ChatTemplate
from batchproof.engine.text.tokenizer import Tokenizer
from batchproof.server.errors import APIError, shown
from batchproof.server.request.protocol import MAX_TOOLS, NamedToolChoice, ResponseFormat, StructuredOutputs, Tool
from batchproof.server.request.structured import MAX_SCHEMA_CHARS, check
from batchproof.server.tools.formats import HERMES, ToolFormat, detect_tool_format, reads_tools

# The format the server teaches a model whose chat template reads no tools (both packaged models'):
# Hermes', the most widely trained one, so a model that has seen it anywhere recognises it.
SERVER_FORMAT = HERMES
NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}
# Compiling a schema costs time in its size (a flat one of 1,000 properties, 64 KB: ~0.09 s; 3,000
# properties, 200 KB: ~0.46 s), and `required` compiles each tool's alone and then all of them
# together, so both are bounded before any compiles: far above a real tool set's (tens of KB).
MAX_PARAMETERS_CHARS = MAX_SCHEMA_CHARS  # one tool's parameters schema, as JSON: as any schema's
MAX_TOOLS_CHARS = 256 * 1024  # all the tools, as JSON


@dataclass(frozen=True)
class ToolPlan:
    mode: Literal["none", "auto", "required", "named"]
    tools: list[dict[str, Any]]  # as OpenAI spells them (what a chat template reads)
    named: str | None  # the function a named tool_choice forces
    is_parallel: bool  # more than one call allowed (parallel_tool_calls, default true)
    tool_format: ToolFormat | None  # auto: how the model writes its calls
    constraint: Constraint | None  # the grammar of the calls (auto: of free text and the calls)
    is_native: bool  # the chat template reads `tools` (else tools/prompt.py describes them)

    @property
    def makes_calls(self) -> bool:
        return self.mode != "none"


def arguments_schema(tool: Tool) -> dict[str, Any]:
    return tool.function.parameters if tool.function.parameters is not None else NO_ARGUMENTS


def calls_schema(tools: list[Tool], is_parallel: bool) -> dict[str, Any]:
    """`required`: a JSON array of one call or more, each {"name": one tool, "arguments": its schema}."""
    one_of_the_tools = [{"type": "object", "properties": {"name": {"const": t.function.name},
                                                          "arguments": arguments_schema(t)},
                         "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    schema: dict[str, Any] = {"type": "array", "items": {"anyOf": one_of_the_tools}, "minItems": 1}
    if not is_parallel:
        schema["maxItems"] = 1
    return schema


def _constraint(schema: dict[str, Any], tokenizer: Tokenizer, param: str) -> Constraint:
    try:
        built = grammars.json_schema(schema)
    except (ValueError, TypeError) as e:
        raise APIError(400, f"'{param}' cannot be enforced: {e}", param="tools") from None
    constraint = Constraint("tool_call", built.grammar)
    check(constraint, tokenizer, "tools")
    return constraint


def _check_arguments_schemas(tools: list[Tool], tokenizer: Tokenizer) -> None:
    """Each function's parameters on their own, so a refusal names the function."""
    for i, tool in enumerate(tools):
        try:
            _constraint(arguments_schema(tool), tokenizer, f"tools[{i}].function.parameters")
        except APIError as e:
            raise APIError(400, f"tools[{i}] ({tool.function.name!r}): {e.message}", param="tools") from None


def check_num_tools(num_tools: int) -> None:
    if num_tools > MAX_TOOLS:
        raise APIError(400, f"'tools' holds {num_tools} tools; at most {MAX_TOOLS} are taken", param="tools")


def _tool_dicts(tools: list[Tool]) -> list[dict[str, Any]]:
    """The tools as OpenAI spells them, once their count and sizes are known to be bounded."""
    check_num_tools(len(tools))
    dicts = [t.model_dump(exclude_none=True) for t in tools]
    total = 0
    for i, (tool, one) in enumerate(zip(tools, dicts)):
        if tool.function.parameters is not None:
            size = len(json.dumps(tool.function.parameters, ensure_ascii=False))
            if size > MAX_PARAMETERS_CHARS:
                raise APIError(400, f"'tools[{i}].function.parameters' is {size} characters of JSON; at most "
                                    f"{MAX_PARAMETERS_CHARS} are taken", param="tools")
        total += len(json.dumps(one, ensure_ascii=False))
        if total > MAX_TOOLS_CHARS:
            raise APIError(400, f"'tools' is more than {MAX_TOOLS_CHARS} characters of JSON (past 'tools[{i}]'); "
                                f"at most {MAX_TOOLS_CHARS} are taken", param="tools")
    return dicts


class ToolRequest(Protocol):
    """What plan_tools reads of a request: a chat completions request's (chat/protocol.py), which
    the Responses API's translation also builds."""

    tools: list[Tool] | None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None
    parallel_tool_calls: bool | None
    response_format: ResponseFormat | None
    structured_outputs: StructuredOutputs | None


def plan_tools(req: ToolRequest, template: ChatTemplate | None, tokenizer: Tokenizer) -> ToolPlan | None:
    tools = req.tools or []
    choice = req.tool_choice
    if not tools:
        if choice not in (None, "none"):
            raise APIError(400, f"'tool_choice' {shown(choice if isinstance(choice, str) else choice.model_dump())} "
                                "needs 'tools'", param="tool_choice")
        return None  # parallel_tool_calls alone changes nothing: accepted, as before tools were served
    tool_dicts = _tool_dicts(tools)  # first: every check after this one costs time in the tools' size
    names = [t.function.name for t in tools]
    twice = sorted(name for name, count in Counter(names).items() if count > 1)
    if twice:
        raise APIError(400, f"'tools' names a function more than once: {twice}", param="tools")
    choice = choice or "auto"
    is_native = template is not None and reads_tools(template.source)
    plan = {"tools": tool_dicts, "named": None,
            "is_parallel": req.parallel_tool_calls is not False, "tool_format": None, "constraint": None,
            "is_native": is_native}
    if choice != "none" and (req.response_format is not None and req.response_format.type != "text"
                             or req.structured_outputs is not None):
        raise APIError(400, "a tool call's arguments follow its parameters' schema; 'response_format' and "
                            "'structured_outputs' cannot also constrain the reply (use tool_choice 'none')",
                       param="response_format" if req.response_format is not None else "structured_outputs")
    if choice == "none":
        return ToolPlan("none", **plan)
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise APIError(400, f"'tool_choice' names the function {shown(choice.function.name)}, which is not in "
                                f"'tools' ({', '.join(names)})", param="tool_choice")
        tool = tools[names.index(choice.function.name)]
        plan |= {"named": tool.function.name,
                 "constraint": _constraint(arguments_schema(tool), tokenizer,
                                           f"tools[{names.index(tool.function.name)}].function.parameters")}
        return ToolPlan("named", **plan)
    if choice == "required":
        _check_arguments_schemas(tools, tokenizer)
        plan["constraint"] = _constraint(calls_schema(tools, plan["is_parallel"]), tokenizer, "tools")
        return ToolPlan("required", **plan)
    if is_native:
        tool_format = detect_tool_format(template.source)
        if tool_format is None:
            raise APIError(400, "tool_choice 'auto' reads calls in the model's own format, and this model's chat "
                                "template takes tools in a format batchproof does not parse (it parses Hermes "
                                "<tool_call> blocks and Llama 3.1 JSON calls); use tool_choice 'required' or a "
                                "named function, whose calls are generated under their parameters' grammar",
                           param="tool_choice")
    else:
        tool_format = SERVER_FORMAT  # the template teaches none: tools/prompt.py teaches this one
    _check_arguments_schemas(tools, tokenizer)  # a refusal names the function, as under `required`
    schemas = {t.function.name: arguments_schema(t) for t in tools}
    constraint = Constraint("tool_call", tool_format.grammar(schemas, plan["is_parallel"]))
    check(constraint, tokenizer, "tools")
    return ToolPlan("auto", **(plan | {"tool_format": tool_format, "constraint": constraint}))
