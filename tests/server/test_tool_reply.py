"""A reply's text as tool calls (server/tools/reply.py), whole and streamed, for each mode."""

import json

from batchproof.server.tools.choice import ToolPlan
from batchproof.server.tools.formats import HERMES
from batchproof.server.tools.reply import ToolReply, whole


def _plan(mode: str, **fields) -> ToolPlan:
    return ToolPlan(mode=mode, tools=[], named=fields.get("named"), is_parallel=fields.get("is_parallel", True),
                    tool_format=HERMES if mode == "auto" else None, constraint=None, is_native=False)


def _calls(message: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]


def test_required_reads_the_array_and_keeps_the_calls_a_cut_completed() -> None:
    text = '[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]'
    message, finish = whole(_plan("required"), text, "stop")
    assert _calls(message) == [("a", {"x": 1}), ("b", {})] and message["content"] is None and finish == "tool_calls"
    message, finish = whole(_plan("required"), text[:50], "length")
    assert _calls(message) == [("a", {"x": 1})] and finish == "length"
    message, finish = whole(_plan("required"), '[{"name": "a", "argu', "length")
    assert message == {"role": "assistant", "content": '[{"name": "a", "argu'} and finish == "length"


def test_required_arguments_nested_past_pythons_stack_stay_text() -> None:
    deep = "[" * 1_200 + "]" * 1_200  # what '[' biased under an arguments schema of {} wrote (issue 58)
    text = f'[{{"name": "a", "arguments": {{"x": 1}}}}, {{"name": "b", "arguments": {{"y": {deep}}}}}]'
    message, finish = whole(_plan("required"), text, "stop")
    assert _calls(message) == [("a", {"x": 1})] and finish == "tool_calls"
    message, finish = whole(_plan("required"), f'[{{"name": "b", "arguments": {{"y": {deep}}}}}]', "stop")
    assert message["content"].startswith('[{"name": "b"') and "tool_calls" not in message and finish == "stop"


def test_named_is_the_arguments_whole_and_streamed_as_they_come() -> None:
    message, finish = whole(_plan("named", named="f"), '{"q": "x"}', "stop")
    assert _calls(message) == [("f", {"q": "x"})] and finish == "tool_calls"
    reply = ToolReply(_plan("named", named="f"))
    first, rest = reply.feed('{"q"'), reply.feed(': "x"}')
    assert first[1][0]["function"] == {"name": "f", "arguments": '{"q"'} and first[1][0]["id"].startswith("call_")
    assert rest == ("", [{"index": 0, "function": {"arguments": ': "x"}'}}]) and reply.finish() == ("", [])


def test_auto_keeps_prose_as_content_and_one_call_without_parallel() -> None:
    text = 'Sure.\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "b", ' \
           '"arguments": {}}\n</tool_call>'
    message, finish = whole(_plan("auto"), text, "stop")
    assert _calls(message) == [("a", {}), ("b", {})] and finish == "tool_calls"
    assert message["content"].strip() == "Sure."
    message, _ = whole(_plan("auto", is_parallel=False), text, "stop")
    assert _calls(message) == [("a", {})]
    message, finish = whole(_plan("auto"), "Just text.", "stop")
    assert message == {"role": "assistant", "content": "Just text."} and finish == "stop"
