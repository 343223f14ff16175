"""Chat messages into the template: refused with a 400 naming `messages` (never a 500) when the
model has no template, when they cannot fit the context (counted before rendering), or when
the template raises."""

import contextlib
from collections.abc import Iterator
from typing import Any

from batchproof.engine.model.front import ModelFront
from batchproof.engine.text.chat_template import TemplateError
from batchproof.server.engine_client import EngineClient
from batchproof.server.errors import APIError
from batchproof.server.request.plan import check_text_fits
from batchproof.server.request.protocol import ChatMessage
from batchproof.server.tools import prompt as tool_prompt
from batchproof.server.tools.choice import ToolPlan
from batchproof.server.tools.formats import reads_tools, shows_tool_role


def _texts(messages: list[ChatMessage]) -> Iterator[str]:
    """Every text the rendered prompt shows: contents, and the earlier calls' names and arguments."""
    for message in messages:
        yield message.text()
        for call in message.tool_calls or []:
            yield call.function.name
            yield call.function.arguments


def check_messages(front: ModelFront, messages: list[ChatMessage]) -> None:
    """Before anything is compiled or rendered: a template to render with, and a conversation
    that could fit the context; rendering and tokenizing a body of megabytes that could never
    fit costs seconds for nothing."""
    if front.chat_template is None:  # a base model: completions only, never a guessed format
        raise APIError(400, front.chat_template_origin, param="messages", code="chat_template_missing")
    # A message the template shows costs at least one token (its role's marker), so a context
    # holds at most max_model_len of them.
    if len(messages) > front.max_model_len:
        raise APIError(400, f"'messages' holds {len(messages)} messages; at most {front.max_model_len} fit this "
                            "model's context (each costs at least one token)", param="messages")
    # The rendered prompt holds every message's text, so their total is a lower bound on it.
    check_text_fits("".join(_texts(messages)), front.tokenizer, front.max_model_len, "'messages'", "messages")


def _template_messages(client: EngineClient, messages: list[ChatMessage],
                       tool_plan: ToolPlan | None = None) -> list[dict[str, Any]]:
    """As the template reads them (check_messages has passed them)."""
    template = client.front.chat_template
    return tool_prompt.template_messages(messages, tool_plan, reads_tools(template.source), shows_tool_role(template))


def _template_tools(tool_plan: ToolPlan | None) -> list[dict[str, Any]] | None:
    """The tools, for a template that reads them (one that does not has them in its system turn)."""
    return tool_plan.tools if tool_plan is not None and tool_plan.is_native else None


@contextlib.contextmanager
def template_refusals() -> Iterator[None]:
    """A template's own raise_exception (roles that do not alternate, a system message it does
    not take) is the request's fault: a 400."""
    try:
        yield
    except TemplateError as e:
        raise APIError(400, f"the chat template refused 'messages': {e}", param="messages") from None


def chat_prompt_ids(client: EngineClient, messages: list[ChatMessage], tool_plan: ToolPlan | None = None) -> list[int]:
    """The prompt of messages that check_messages passed (the chat route checks them before it
    compiles the tools' grammar, which comes before this)."""
    with template_refusals():
        return client.chat_prompt_ids(_template_messages(client, messages, tool_plan), _template_tools(tool_plan))


def render_chat(client: EngineClient, messages: list[ChatMessage], add_generation_prompt: bool) -> str:
    check_messages(client.front, messages)
    dicts = _template_messages(client, messages)
    with template_refusals():
        return client.front.chat_template.render(dicts, add_generation_prompt)
