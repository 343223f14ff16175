"""The Responses store's budgets: one key filling its own evicts only its own responses, past the
global budget the largest holder gives way, and the bytes counted are the bytes held (the store
keeps compact JSON, not the caller's dicts)."""

import gc
import tracemalloc
from typing import Any

from batchproof.server.guards.auth import key_id
from batchproof.server.responses.store import ENTRY_OVERHEAD_BYTES, ResponseStore
from tests.helpers.http import post
from tests.helpers.live_server import live_server

KEY_BUDGET = 4000
LARGE = 2 * KEY_BUDGET  # far past any one key's budget: many responses


def _response(response_id: str, chars: int = 400) -> dict[str, Any]:
    return {"id": response_id, "object": "response", "output": [{"text": "x" * chars}]}


def _fill(store: ResponseStore, tenant: str, num: int, prefix: str) -> None:
    for i in range(num):
        store.put(tenant, _response(f"{prefix}_{i}"), [{"role": "user", "content": "hi"}])


def test_a_key_filling_its_budget_never_evicts_another_keys() -> None:
    store = ResponseStore(budget_bytes=2 * KEY_BUDGET, key_budget_bytes=KEY_BUDGET)
    store.put("key-b", _response("resp_b"), [])
    _fill(store, "key-a", LARGE // 400, "resp_a")  # many times key-a's budget
    assert store.get("key-b", "resp_b") is not None
    assert store.get("key-a", "resp_a_0") is None  # key-a's own least recently used went first
    assert store.get("key-a", f"resp_a_{LARGE // 400 - 1}") is not None
    assert 0 < store.key_used_bytes("key-a") <= KEY_BUDGET
    assert store.used_bytes == store.key_used_bytes("key-a") + store.key_used_bytes("key-b")


def test_past_the_global_budget_the_largest_holder_gives_way() -> None:
    store = ResponseStore(budget_bytes=2 * KEY_BUDGET, key_budget_bytes=KEY_BUDGET)
    _fill(store, "key-a", LARGE // 400, "resp_a")
    _fill(store, "key-b", LARGE // 400, "resp_b")  # a and b: each at its budget, the sum at the global one
    a_before, b_before = store.key_used_bytes("key-a"), store.key_used_bytes("key-b")
    store.put("key-c", _response("resp_c"), [])  # over the global budget: not c's, one of the full keys'
    assert store.get("key-c", "resp_c") is not None
    assert store.used_bytes <= store.budget_bytes
    assert store.key_used_bytes("key-a") + store.key_used_bytes("key-b") < a_before + b_before
    for _ in range(3):  # c stays under its fair share, so neither full key's traffic evicts it
        _fill(store, "key-a", 2, "resp_a_more")
        _fill(store, "key-b", 2, "resp_b_more")
        assert store.get("key-c", "resp_c") is not None


def test_oversized_and_deleted_responses_leave_nothing_counted() -> None:
    store = ResponseStore(budget_bytes=2 * KEY_BUDGET, key_budget_bytes=KEY_BUDGET)
    store.put("key-a", _response("resp_big", chars=KEY_BUDGET), [])  # larger than a key's budget
    assert store.get("key-a", "resp_big") is None and store.used_bytes == 0
    store.put("key-a", _response("resp_1"), [])
    store.put("key-a", _response("resp_1"), [])  # the same id again: replaced, not counted twice
    assert len(store) == 1
    assert store.delete("key-a", "resp_1") and not store.delete("key-a", "resp_1")
    assert store.used_bytes == 0 and store.key_used_bytes("key-a") == 0 and len(store) == 0


def test_what_is_got_is_what_was_put_and_no_one_else_can_change_it() -> None:
    store = ResponseStore()
    response = {"id": "resp_1", "output": [{"text": "日本語 🎉", "logprob": -0.1}]}
    conversation = [{"role": "user", "content": "hi"}]
    store.put(None, response, conversation)
    response["output"][0]["text"] = "changed after it was stored"
    conversation.append({"role": "assistant", "content": "injected"})
    got = store.get(None, "resp_1")
    assert got.response == {"id": "resp_1", "output": [{"text": "日本語 🎉", "logprob": -0.1}]}
    assert got.conversation == [{"role": "user", "content": "hi"}]
    got.conversation.append({"role": "user", "content": "a follow-up's turn"})  # a reader's copy
    assert store.get(None, "resp_1").conversation == [{"role": "user", "content": "hi"}]


def _logprob_response(i: int) -> dict[str, Any]:
    """A response whose dicts hold several times its JSON: the shape logprobs take."""
    entries = [{"token": "ab", "logprob": -0.5 - n, "bytes": [97, 98],
                "top_logprobs": [{"token": "c", "logprob": -1.25 - n, "bytes": [99]}]} for n in range(1000)]
    return {"id": f"resp_{i}", "output": [{"logprobs": entries}]}


def test_the_bytes_counted_are_the_bytes_held() -> None:
    store = ResponseStore()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(8):  # built here and dropped: the store is the only holder
            store.put("key-a", _logprob_response(i), [{"role": "user", "content": "hi"}])
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    counted = store.used_bytes
    assert counted > 8 * ENTRY_OVERHEAD_BYTES
    # Counting the JSON while holding the dicts is several times under; this count errs only above.
    assert 0.8 * counted <= held <= 1.1 * counted, (held, counted)


def test_over_http_one_keys_responses_never_evict_anothers(engine, tmp_path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("tenant-one\ntenant-two\n")
    with live_server(engine, api_key_file=keys) as live:
        # ~1.5 KB a response here: four fit in a key's budget, eight of them fill the global one
        store = ResponseStore(budget_bytes=12_000, key_budget_bytes=6_000)
        live.app.state.responses = store  # the Responses endpoint's own (responses/route.py)

        def create(key: str) -> str:
            body = {"input": "Say hi.", "max_output_tokens": 2, "temperature": 0}
            reply = post(live.url, "/v1/responses", body, headers={"Authorization": f"Bearer {key}"})
            assert reply.status_code == 200, reply.text
            return reply.json()["id"]

        kept = create("tenant-two")
        mine = [create("tenant-one") for _ in range(8)]  # twice tenant-one's budget
        assert store.get(key_id("tenant-one"), mine[0]) is None  # its own oldest went
        assert store.get(key_id("tenant-one"), mine[-1]) is not None
        got = post(live.url, "/v1/responses", {"input": "Go on.", "max_output_tokens": 2,
                                               "previous_response_id": kept},
                   headers={"Authorization": "Bearer tenant-two"})
        assert got.status_code == 200, got.text
