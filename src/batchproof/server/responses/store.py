"""Stored responses, in bounded memory: what `previous_response_id` continues and
`GET /v1/responses/{id}` returns. A server restart forgets them all (documented: this is a cache
of conversations, not a database).

Each is kept under the API key that made it: another key's id reads as not found, so ids
leak nothing between tenants, as the prefix cache's namespaces leak nothing. Each key has its
own budget and its own least-recently-used order, so one key filling its budget evicts only its
own responses; a global budget bounds the sum, and when keys together pass it the key holding the
most gives way first, so a key holding no more than its fair share (the global budget over the
keys holding responses) is never evicted by another's traffic.

A response is held as its compact JSON bytes, decoded on read: the budget then counts the memory
actually held (a dict of logprob entries holds several times its JSON), and a reader gets a fresh
copy that nothing else can mutate."""

import json
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from batchproof.common.wire import dumps

# What one key may keep: as much as the whole store held before per-key budgets.
DEFAULT_KEY_BUDGET_BYTES = 64 * 2**20
# Four keys' worth: up to four keys never evict one another; past that the largest holder yields.
DEFAULT_BUDGET_BYTES = 4 * DEFAULT_KEY_BUDGET_BYTES
# An entry's memory beyond its two JSON blobs: the Stored object, the id string, the per-key
# OrderedDict's slot and link (~250 bytes by tracemalloc on CPython 3.11; rounded up for resizes).
ENTRY_OVERHEAD_BYTES = 384


@dataclass(frozen=True, slots=True)
class Stored:
    response_json: bytes  # the response object as it was sent, compact JSON: what GET returns
    # its input and output as chat messages (no instructions): what a follow-up continues
    conversation_json: bytes
    size: int  # the bytes this entry holds, as the budgets count them

    @property
    def response(self) -> dict[str, Any]:
        return json.loads(self.response_json)

    @property
    def conversation(self) -> list[dict[str, Any]]:
        return json.loads(self.conversation_json)


@dataclass
class _KeyEntries:
    """One key's responses, least recently used first, and the bytes they hold."""

    entries: OrderedDict[str, Stored] = field(default_factory=OrderedDict)
    used_bytes: int = 0


def stored(response: dict[str, Any], conversation: list[dict[str, Any]]) -> Stored:
    """The entry for a response, serialized once; its size is what its objects hold."""
    response_json = dumps(response).encode()
    conversation_json = dumps(conversation).encode()
    size = sys.getsizeof(response_json) + sys.getsizeof(conversation_json) + ENTRY_OVERHEAD_BYTES
    return Stored(response_json, conversation_json, size)


class ResponseStore:
    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES,
                 key_budget_bytes: int = DEFAULT_KEY_BUDGET_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self.key_budget_bytes = min(key_budget_bytes, budget_bytes)
        self.used_bytes = 0
        # Keys are the server's API keys (and None without any), a set fixed at start: a scan
        # over them for the largest holder is cheap, and the dict cannot grow without bound.
        self._keys: dict[str | None, _KeyEntries] = {}
        self._lock = threading.Lock()  # written from the event loop, read from planning threads

    def put(self, tenant: str | None, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        entry = stored(response, conversation)  # serialized outside the lock: it may be large
        if entry.size > self.key_budget_bytes:
            return  # larger than a key's whole budget: never kept (a follow-up gets a clear 404)
        with self._lock:
            self._drop(tenant, response["id"])
            held = self._keys.setdefault(tenant, _KeyEntries())
            held.entries[response["id"]] = entry
            held.used_bytes += entry.size
            self.used_bytes += entry.size
            while held.used_bytes > self.key_budget_bytes:
                self._evict_oldest(tenant)
            while self.used_bytes > self.budget_bytes:
                self._evict_oldest(max(self._keys, key=lambda key: self._keys[key].used_bytes))

    def get(self, tenant: str | None, response_id: str) -> Stored | None:
        with self._lock:
            held = self._keys.get(tenant)
            entry = held.entries.get(response_id) if held is not None else None
            if entry is not None:
                held.entries.move_to_end(response_id)
            return entry

    def delete(self, tenant: str | None, response_id: str) -> bool:
        with self._lock:
            return self._drop(tenant, response_id)

    def key_used_bytes(self, tenant: str | None) -> int:
        """The bytes `tenant`'s responses hold."""
        with self._lock:
            held = self._keys.get(tenant)
            return held.used_bytes if held is not None else 0

    def __len__(self) -> int:
        with self._lock:
            return sum(len(held.entries) for held in self._keys.values())

    def _drop(self, tenant: str | None, response_id: str) -> bool:
        held = self._keys.get(tenant)
        entry = held.entries.pop(response_id, None) if held is not None else None
        if entry is None:
            return False
        self._forget(tenant, held, entry)
        return True

    def _evict_oldest(self, tenant: str | None) -> None:
        held = self._keys[tenant]
        _, entry = held.entries.popitem(last=False)
        self._forget(tenant, held, entry)

    def _forget(self, tenant: str | None, held: _KeyEntries, entry: Stored) -> None:
        held.used_bytes -= entry.size
        self.used_bytes -= entry.size
        if not held.entries:
            del self._keys[tenant]  # a key holding nothing is not a candidate for eviction
