"""Token-space conversations (docs/rl-rollouts.md): a chat or Responses prompt sent as ids
(`prompt_token_ids` beside `messages: []` / `input: []`) gives bitwise the reply of the messages
that render to them; `return_tokens_as_token_ids` spells every entry `token_id:N`; `continue_from`
holds a re-rendered turn to the ids generated before it (a 400 naming the first index that
differs), and the prefix cache serves the previous turn; bad ids are 400s naming the field."""

import uuid

import pytest

from tests.helpers.http import assert_error, chunks, messages, post, stream, streamed_chat

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
QUESTION = "Name a fruit."


def _greedy(**fields) -> dict:
    return {"temperature": 0, "max_tokens": 12, "logprobs": True, "top_logprobs": 2, **fields}


@pytest.fixture(scope="module")
def by_messages(server) -> dict:
    reply = post(server.url, CHAT, _greedy(messages=messages(QUESTION), return_token_ids=True))
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_token_in_chat_equals_the_messages_it_renders(server, by_messages) -> None:
    ids = by_messages["prompt_token_ids"]
    reply = post(server.url, CHAT, _greedy(messages=[], prompt_token_ids=ids, return_token_ids=True)).json()
    assert reply["prompt_token_ids"] == ids
    assert reply["choices"][0]["token_ids"] == by_messages["choices"][0]["token_ids"]
    assert reply["choices"][0]["logprobs"] == by_messages["choices"][0]["logprobs"]
    assert reply["usage"]["prompt_tokens"] == len(ids)
    content, entries, _ = streamed_chat(stream(server.url, CHAT, _greedy(messages=[], prompt_token_ids=ids))[2])
    assert content == by_messages["choices"][0]["message"]["content"]
    assert entries == by_messages["choices"][0]["logprobs"]["content"]


def test_token_in_responses_equals_chat(server, by_messages) -> None:
    body = {"input": [], "prompt_token_ids": by_messages["prompt_token_ids"], "temperature": 0,
            "max_output_tokens": 12, "include": ["message.output_text.logprobs"], "top_logprobs": 2}
    reply = post(server.url, RESPONSES, body)
    assert reply.status_code == 200, reply.text
    (part,) = reply.json()["output"][0]["content"]
    assert part["text"] == by_messages["choices"][0]["message"]["content"]
    assert [e["logprob"] for e in part["logprobs"]] == [e["logprob"] for e in by_messages["choices"][0]["logprobs"]
                                                         ["content"]]
    # Its stored conversation has no messages to re-render: continuing it by id is refused.
    later = post(server.url, RESPONSES, {"input": "More.", "previous_response_id": reply.json()["id"]})
    assert_error(later, 400, param="previous_response_id", mentions=("prompt_token_ids",))


def test_tokens_as_token_ids_on_chat(server, by_messages) -> None:
    body = _greedy(messages=messages(QUESTION), return_token_ids=True, return_tokens_as_token_ids=True)
    (choice,) = post(server.url, CHAT, body).json()["choices"]
    plain = by_messages["choices"][0]
    assert [e["token"] for e in choice["logprobs"]["content"]] == [f"token_id:{i}" for i in choice["token_ids"][
        :len(choice["logprobs"]["content"])]]
    for entry, text_entry in zip(choice["logprobs"]["content"], plain["logprobs"]["content"], strict=True):
        assert entry["bytes"] == text_entry["bytes"] and entry["logprob"] == text_entry["logprob"]
        assert all(alt["token"].startswith("token_id:") for alt in entry["top_logprobs"])
    _, entries, _ = streamed_chat(stream(server.url, CHAT, body)[2])
    assert entries == choice["logprobs"]["content"]


def test_tokens_as_token_ids_on_completions(server) -> None:
    body = {"prompt": "The sea is", "temperature": 0, "max_tokens": 6, "logprobs": 1, "echo": True,
            "return_token_ids": True, "return_tokens_as_token_ids": True}
    (choice,) = post(server.url, COMPLETIONS, body).json()["choices"]
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [f"token_id:{i}" for i in choice["prompt_token_ids"] + choice["token_ids"]]
    assert all(key.startswith("token_id:") for top in logprobs["top_logprobs"][1:] for key in top)
    del body["echo"]
    streamed = [t for c in chunks(stream(server.url, COMPLETIONS, body)[2]) for t in c["choices"][0]["logprobs"]
                ["tokens"]]
    assert streamed == logprobs["tokens"][len(choice["prompt_token_ids"]):]


def _two_turns(server, salt: str) -> tuple[dict, list[dict]]:
    """A first turn (ended by its end token) and the conversation that continues it."""
    first = post(server.url, CHAT, {"messages": messages("Say hi."), "temperature": 0, "max_tokens": 40,
                                    "return_token_ids": True, "cache_salt": salt}).json()
    assert first["choices"][0]["finish_reason"] == "stop", first
    turn = [*messages("Say hi."), {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
            *messages("And again.")]
    return first, turn


def test_a_continuation_extends_the_previous_turn_and_hits_the_cache(server) -> None:
    salt = uuid.uuid4().hex
    first, turn = _two_turns(server, salt)
    previous = {"prompt_token_ids": first["prompt_token_ids"], "token_ids": first["choices"][0]["token_ids"]}
    before = previous["prompt_token_ids"] + previous["token_ids"]
    reply = post(server.url, CHAT, {"messages": turn, "temperature": 0, "max_tokens": 4, "return_token_ids": True,
                                    "continue_from": previous, "cache_salt": salt})
    assert reply.status_code == 200, reply.text
    assert reply.json()["prompt_token_ids"][:len(before)] == before
    # Every position the previous turn computed, its partial last block included: all but its
    # end token, which was chosen, never fed back (this turn computes it first).
    cached = reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == len(before) - 1
    # Token-in continues the same way.
    ids = reply.json()["prompt_token_ids"]
    token_in = post(server.url, CHAT, {"messages": [], "prompt_token_ids": ids, "continue_from": previous,
                                       "temperature": 0, "max_tokens": 4, "cache_salt": salt})
    assert token_in.status_code == 200, token_in.text


def test_a_reply_sent_back_as_other_text_is_a_400_naming_the_index(server) -> None:
    first, turn = _two_turns(server, uuid.uuid4().hex)
    previous = {"prompt_token_ids": first["prompt_token_ids"], "token_ids": first["choices"][0]["token_ids"]}
    turn[1]["content"] += " "  # a client that edits the reply re-tokenises it
    at = len(previous["prompt_token_ids"]) + len(previous["token_ids"]) - 1  # where the end token was
    reply = post(server.url, CHAT, {"messages": turn, "continue_from": previous, "max_tokens": 2})
    assert_error(reply, 400, param="continue_from", mentions=(f"index {at}", "<|im_end|>"))
    short = post(server.url, CHAT, {"messages": [], "prompt_token_ids": previous["prompt_token_ids"],
                                    "continue_from": previous, "max_tokens": 2})
    assert_error(short, 400, param="continue_from", mentions=(f"index {len(previous['prompt_token_ids'])}",))


def test_a_reply_with_no_tokens_continues(server) -> None:
    """A real reply can have no tokens: a stop string that cut it at its first token. Its turn
    continues from it (token_ids []), and gives what the same request without continue_from gives."""
    ask = {"messages": messages("Say hi."), "temperature": 0, "max_tokens": 4, "return_token_ids": True}
    first_text = post(server.url, CHAT, ask).json()["choices"][0]["message"]["content"]
    first = post(server.url, CHAT, {**ask, "stop": [first_text[:2]]}).json()
    (choice,) = first["choices"]
    assert (choice["message"]["content"], choice["token_ids"], choice["finish_reason"]) == ("", [], "stop")
    turn = [*messages("Say hi."), {"role": "assistant", "content": ""}, *messages("And again.")]
    fresh = _greedy(messages=turn, return_token_ids=True)
    continued = post(server.url, CHAT, {**fresh, "continue_from": {"prompt_token_ids": first["prompt_token_ids"],
                                                                   "token_ids": []}})
    assert continued.status_code == 200, continued.text
    without = post(server.url, CHAT, fresh).json()
    assert continued.json()["prompt_token_ids"][:len(first["prompt_token_ids"])] == first["prompt_token_ids"]
    assert continued.json()["choices"][0]["token_ids"] == without["choices"][0]["token_ids"]
    assert continued.json()["choices"][0]["logprobs"] == without["choices"][0]["logprobs"]


@pytest.mark.parametrize(("body", "param", "mentions"), [
    ({"messages": [], "prompt_token_ids": [1, 49152]}, "prompt_token_ids", ("'prompt_token_ids[1]' is 49152",)),
    ({"messages": [], "prompt_token_ids": [-1]}, "prompt_token_ids", ("-1",)),
    ({"messages": [], "prompt_token_ids": []}, "prompt_token_ids", ("got []",)),
    ({"messages": messages("hi"), "prompt_token_ids": [1, 2]}, "messages", ("must be []",)),
    ({"messages": []}, "messages", ("prompt_token_ids",)),
    ({"messages": [], "prompt_token_ids": [1] * 9000}, "prompt_token_ids", ("9000 tokens",)),
    ({"messages": messages("hi"), "continue_from": {"prompt_token_ids": [], "token_ids": [1]}}, "continue_from",
     ("'continue_from.prompt_token_ids' must not be empty",)),
    ({"messages": messages("hi"), "continue_from": {"prompt_token_ids": [1], "token_ids": [77777]}}, "continue_from",
     ("'continue_from.token_ids[0]' is 77777",)),
])
def test_bad_token_prompts_are_400s_naming_the_field(server, body, param, mentions) -> None:
    assert_error(post(server.url, CHAT, {**body, "max_tokens": 1}), 400, param=param, mentions=mentions)


def test_bad_token_prompts_on_responses(server) -> None:
    assert_error(post(server.url, RESPONSES, {"input": "hi", "prompt_token_ids": [1, 2]}), 400, param="input",
                 mentions=("must be []",))
    assert_error(post(server.url, RESPONSES, {"input": [], "prompt_token_ids": [1], "instructions": "x"}), 400,
                 param="instructions")
    assert_error(post(server.url, RESPONSES, {"input": [], "prompt_token_ids": [49152]}), 400,
                 param="prompt_token_ids", mentions=("49152",))
