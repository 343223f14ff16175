"""Issue 59, item 6: the server's share of the hand-made bugs an audit found the suite did not
catch. Each test names, under "catches:", the one-line change it was written against."""

import asyncio
import json

import pytest
from pydantic import BaseModel

from batchproof.server.admin import TokenizeRequest
from batchproof.server.chat.protocol import ChatCompletionRequest
from batchproof.server.completions.protocol import CompletionRequest
from batchproof.server.config import ServerConfig
from batchproof.server.errors import APIError
from batchproof.server.guards import precount as counting
from batchproof.server.guards.host_check import RequireKnownHost, allowed_hosts
from batchproof.server.request.protocol import MAX_METADATA_PAIRS, MAX_TOOLS
from batchproof.server.responses.protocol import ResponsesRequest
from batchproof.server.state import parse_body
from tests.helpers.http import assert_error, post

CHAT = "/v1/chat/completions"


# --- 7. continue_from: a prompt one id short of the previous turn ----------------------------

def test_a_prompt_one_id_short_of_the_previous_turn_is_a_400_naming_where_it_ends(server) -> None:
    """The new prompt is the previous prompt and reply less the reply's last id: it stops
    inside the previous turn, so it does not extend it.

    catches: token_space.check_continues accepting a prompt one id shorter than prompt + reply
    (`len(prompt_ids) >= len(before) - 1`)."""
    previous = {"prompt_token_ids": [1, 9690, 198, 19556, 314], "token_ids": [504, 2683, 30]}
    before = previous["prompt_token_ids"] + previous["token_ids"]
    for short in (before[:-1], before[:-2], previous["prompt_token_ids"]):
        reply = post(server.url, CHAT, {"messages": [], "prompt_token_ids": short, "continue_from": previous,
                                        "max_tokens": 1})
        assert_error(reply, 400, param="continue_from", mentions=(f"ends at index {len(short)}",))
    whole = post(server.url, CHAT, {"messages": [], "prompt_token_ids": before, "continue_from": previous,
                                    "max_tokens": 1})
    assert whole.status_code == 200, whole.text  # the boundary: exactly prompt + reply extends it


# --- 10. every counted field of every route, refused before validation -----------------------

MODELS = [ChatCompletionRequest, CompletionRequest, ResponsesRequest, TokenizeRequest]
# The cap each counted field is held to, written here from the limits where they apply (OpenAI's
# 128 tools, 16 metadata pairs; any list of messages, prompts, items or ids at MAX_LISTED_ITEMS),
# not read from the model: a cap set wrong on a model (1000x too high) must fail here.
CAPS = {"messages": counting.MAX_LISTED_ITEMS, "input": counting.MAX_LISTED_ITEMS,
        "prompt": counting.MAX_LISTED_ITEMS, "prompt_token_ids": counting.MAX_LISTED_ITEMS,
        "prompt_logprob_token_ids": counting.MAX_LISTED_ITEMS, "tools": MAX_TOOLS, "metadata": MAX_METADATA_PAIRS}
# Fields a body needs besides the oversized one (short, so that only that field is over its cap).
REQUIRED = {ChatCompletionRequest: {"messages": []}, CompletionRequest: {"prompt": "hi"},
            ResponsesRequest: {"input": "hi"}, TokenizeRequest: {}}
COUNTED = [(model, name) for model in MODELS for name in model.counted_items]


def oversized(model: type[BaseModel], name: str) -> bytes:
    """A body whose `name` holds one item more than its cap, each item cheap (a short string, or
    a key for metadata), padded past the size from which bodies are counted; well inside the
    JSON budgets, so that the field's own count is what refuses it."""
    count = CAPS[name] + 1
    value = {f"k{i}": "v" for i in range(count)} if name == "metadata" else ["a"] * count
    body = {**REQUIRED[model], name: value, "user": "x" * counting.PRECOUNT_FROM_BYTES}
    raw = json.dumps(body).encode()
    objects, members, values = counting._count_structure(raw)
    assert len(raw) >= counting.PRECOUNT_FROM_BYTES
    assert objects <= counting.MAX_JSON_OBJECTS and members <= counting.MAX_JSON_MEMBERS
    assert values <= counting.MAX_JSON_VALUES
    return raw


def test_every_counted_field_has_its_cap_written_here() -> None:
    assert {name for _, name in COUNTED} <= set(CAPS)
    assert {"tools", "prompt_token_ids"} <= set(ResponsesRequest.counted_items)  # Responses' own included


@pytest.mark.parametrize(("model", "name"), COUNTED, ids=[f"{m.__name__}.{n}" for m, n in COUNTED])
def test_one_item_over_a_counted_field_s_cap_is_refused_before_validation(model, name, monkeypatch) -> None:
    """catches: a counted field's cap set too high on its request model (e.g. ResponsesRequest's
    `"tools": MAX_TOOLS * 1000`): the body then reaches validation, however long it holds the GIL."""
    def never(*args, **kwargs):
        raise AssertionError("validated before the count")

    monkeypatch.setattr(model, "model_validate_json", never)
    with pytest.raises(APIError) as refused:
        parse_body(model, oversized(model, name))
    assert refused.value.status == 400 and refused.value.param == name
    assert f"holds {CAPS[name] + 1}" in refused.value.message and f"at most {CAPS[name]}" in refused.value.message


# --- 11. the Host allow-list for each bind address -------------------------------------------

LOOPBACK = {"localhost", "127.0.0.1", "[::1]"}


@pytest.mark.parametrize(("bound", "allowed"), [
    ("127.0.0.1", LOOPBACK),
    ("0.0.0.0", LOOPBACK),
    ("::", LOOPBACK),
    ("", LOOPBACK),
    ("::1", LOOPBACK),
    ("192.168.1.5", LOOPBACK | {"192.168.1.5"}),
    ("fe80::1", LOOPBACK | {"[fe80::1]"}),
    ("GPU-Box.local", LOOPBACK | {"gpu-box.local"}),
])
def test_the_allowed_hosts_for_each_bind_address(bound, allowed) -> None:
    """An address that binds every interface (0.0.0.0, ::) names no host: a page whose name
    resolves there is refused like any other, so neither it nor its bracketed form is allowed.

    catches: host_check.allowed_hosts adding the bound address whatever it is (the ANY_ADDRESS
    test left out), which lets a Host of `0.0.0.0` or `[::]` in."""
    assert allowed_hosts(ServerConfig(host=bound)) == allowed


def status_for(hosts: frozenset[str], host: str) -> int:
    """The status RequireKnownHost gives a GET / with this Host (200 where it passes it on)."""
    sent: list[dict] = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": "/v1/models", "method": "GET", "headers": [(b"host", host.encode())],
             "query_string": b"", "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 8080),
             "client": ("127.0.0.1", 5000), "root_path": ""}
    asyncio.run(RequireKnownHost(app, hosts)(scope, receive, send))
    return sent[0]["status"]


@pytest.mark.parametrize("bound", ["0.0.0.0", "::"])
def test_bound_to_every_interface_a_host_naming_the_any_address_is_refused(bound) -> None:
    hosts = allowed_hosts(ServerConfig(host=bound))
    for host in ("0.0.0.0", "0.0.0.0:8080", "[::]", "[::]:8080"):
        assert status_for(hosts, host) == 403, host
    for host in ("localhost:8080", "127.0.0.1", "[::1]:8080"):
        assert status_for(hosts, host) == 200, host
