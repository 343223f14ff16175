"""Behaviours a hand-made bug in each once survived the whole suite (issue 37): consecutive tool
results as one turn, function_call items as one assistant turn, cache_salt through the Responses
translation, an output item cut by max_output_tokens marked incomplete, each streamed choice's
own prompt ids, and the ids of a UTF-8 tail held back until the reply finished."""

import json
import uuid

import pytest

from batchproof.engine.model.ops import kernels
from batchproof.server.request.protocol import ChatMessage
from batchproof.server.responses.translate import input_messages
from batchproof.server.tools.prompt import template_messages
from tests.helpers.http import EMOJI_PROMPT, chat_body, chunks, post, stream

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
# The chat route's prompt for EMOJI_PROMPT, as text for the completions route.
EMOJI_CHATML = f"<|im_start|>user\n{EMOJI_PROMPT}<|im_end|>\n<|im_start|>assistant\n"
# Longer than one 16-token block of the prefix cache even after the chat template's opening.
LONG_INPUT = ("A ledger of every ship that came past the breakwater: its name, its flag, its cargo and the "
              "hour of the tide, kept by the harbour master for forty years. ") * 2


# --- tool turns as the template reads them --------------------------------------------------

def _call(call_id: str, name: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def test_consecutive_tool_results_are_one_user_turn_in_order() -> None:
    """Parallel calls' results, spelled for a template that reads no tools: one user turn, so
    the roles still alternate (Gemma's template raises otherwise)."""
    messages = [ChatMessage(role="user", content="weather and time?"),
                ChatMessage(role="assistant", tool_calls=[_call("c1", "get_weather"), _call("c2", "get_time")]),
                ChatMessage(role="tool", tool_call_id="c1", content="sunny"),
                ChatMessage(role="tool", tool_call_id="c2", content="noon"),
                ChatMessage(role="assistant", content="Sunny at noon."),
                ChatMessage(role="tool", tool_call_id="c2", content="one"),  # a lone result: a turn of its own
                ]
    turns = template_messages(messages, None, is_native=False)
    assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant", "user"]
    assert turns[2]["content"] == ("Result of get_weather (call c1):\nsunny\n\n"
                                   "Result of get_time (call c2):\nnoon")
    assert turns[4]["content"] == "Result of get_time (call c2):\none"


def test_two_function_call_items_are_one_assistant_turn_with_two_calls() -> None:
    """As a client echoes a response with parallel calls back: the text, then its calls, is one
    assistant turn; each output is a tool message."""
    items = [{"type": "message", "role": "user", "content": "weather and time?"},
             {"type": "message", "role": "assistant", "content": "Let me look."},
             {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
             {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
             {"type": "function_call_output", "call_id": "c2", "output": "noon"},
             {"type": "function_call", "call_id": "c3", "name": "get_time", "arguments": "{}"},
             {"type": "function_call", "call_id": "c4", "name": "get_weather", "arguments": "{}"}]
    messages = input_messages(items)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert messages[1]["content"] == "Let me look."
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["c1", "c2"]
    assert messages[4]["content"] is None  # calls with no text before them open their own turn
    assert [c["function"]["name"] for c in messages[4]["tool_calls"]] == ["get_time", "get_weather"]


# --- the Responses API ----------------------------------------------------------------------

def _responses_cached(url: str, salt: str) -> int:
    reply = post(url, RESPONSES, {"input": LONG_INPUT, "max_output_tokens": 1, "temperature": 0,
                                  "cache_salt": salt, "store": False})
    assert reply.status_code == 200, reply.text
    return reply.json()["usage"]["input_tokens_details"]["cached_tokens"]


@pytest.mark.skipif(not kernels.available(), reason="the cache needs our kernels")
def test_a_responses_cache_salt_sets_a_request_apart(server) -> None:
    """Salts a, a, b: a miss, a hit, a miss. Fresh salts, so no earlier test warmed them."""
    salt_a, salt_b = f"a-{uuid.uuid4().hex}", f"b-{uuid.uuid4().hex}"
    assert _responses_cached(server.url, salt_a) == 0
    assert _responses_cached(server.url, salt_a) > 0
    assert _responses_cached(server.url, salt_b) == 0


def _response_events(raw: str) -> list[dict]:
    """The data of each `event: ...` / `data: ...` block of a Responses stream."""
    return [json.loads(block.split("\ndata: ", 1)[1]) for block in raw.split("\n\n") if "\ndata: " in block]


def test_an_output_item_cut_by_max_output_tokens_is_incomplete(server) -> None:
    body = {"input": "Write a long story about the sea.", "max_output_tokens": 4, "temperature": 0,
            "ignore_eos": True, "store": False}
    whole = post(server.url, RESPONSES, body).json()
    assert whole["status"] == "incomplete"
    assert [item["status"] for item in whole["output"]] == ["incomplete"]
    raw = post(server.url, RESPONSES, {**body, "stream": True}).text
    events = _response_events(raw)
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [item["status"] for item in done] == ["incomplete"]
    assert events[-1]["type"] == "response.incomplete"
    assert [item["status"] for item in events[-1]["response"]["output"]] == ["incomplete"]
    # Ended by itself, the same item is completed.
    ended = post(server.url, RESPONSES, {"input": "Say hi.", "max_output_tokens": 200, "temperature": 0,
                                         "store": False}).json()
    assert ended["status"] == "completed" and [item["status"] for item in ended["output"]] == ["completed"]


# --- return_token_ids -----------------------------------------------------------------------

def test_streamed_multi_prompt_token_ids_are_each_choices_own(server, engine) -> None:
    """Three prompts, two choices each: choice i answers prompt i // 2, streamed as whole."""
    prompts = ["The capital of France is", "Count: one, two,", "My favourite colour is"]
    body = {"prompt": prompts, "n": 2, "max_tokens": 3, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    _, _, events = stream(server.url, COMPLETIONS, body)
    prompt_ids: dict[int, list[list[int]]] = {}
    token_ids: dict[int, list[int]] = {}
    for chunk in chunks(events):
        for choice in chunk["choices"]:
            if "prompt_token_ids" in choice:
                prompt_ids.setdefault(choice["index"], []).append(choice["prompt_token_ids"])
            token_ids.setdefault(choice["index"], []).extend(choice["token_ids"])
    whole = post(server.url, COMPLETIONS, body).json()["choices"]
    for index in range(len(prompts) * 2):
        expected = engine.tokenizer.encode(prompts[index // 2])
        assert prompt_ids[index] == [expected], f"choice {index}"  # once, on its first chunk
        assert whole[index]["prompt_token_ids"] == expected
        assert token_ids[index] == whole[index]["token_ids"] and len(token_ids[index]) == 3


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_the_held_back_utf8_tails_ids_reach_the_reply(server, route) -> None:
    """The reply repeats an emoji spelled over byte tokens: cut at each length, some replies end
    inside a character, whose bytes (and ids) were held back until the finish. Every id is in
    the reply, streamed and whole, and no reply is a 500."""
    cut_inside = 0
    for max_tokens in range(4, 12):
        if route == "chat":
            path, body = CHAT, chat_body(EMOJI_PROMPT, max_tokens=max_tokens, return_token_ids=True)
        else:
            path, body = COMPLETIONS, {"prompt": EMOJI_CHATML, "max_tokens": max_tokens, "temperature": 0,
                                       "return_token_ids": True}
        reply = post(server.url, path, body)
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        assert len(choice["token_ids"]) == reply.json()["usage"]["completion_tokens"], max_tokens
        text = choice["message"]["content"] if route == "chat" else choice["text"]
        cut_inside += text.endswith("\ufffd")
        _, _, events = stream(server.url, path, body)
        streamed = [i for chunk in chunks(events) for c in chunk["choices"] for i in c.get("token_ids") or []]
        assert streamed == choice["token_ids"], max_tokens
    assert cut_inside, "no length cut the reply inside a character: the prompt no longer tests the tail"
