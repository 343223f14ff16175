"""Stored responses, in bounded memory: what `previous_response_id` continues and
`GET /v1/responses/{id}` returns. Least recently used goes first once the budget is spent; a
server restart forgets them all (documented: this is a cache of conversations, not a database).

Each is kept under the API key that made it: another key's id reads as not found, so ids
leak nothing between tenants, as the prefix cache's namespaces leak nothing."""

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from batchproof.common.wire import dumps

DEFAULT_BUDGET_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Stored:
    response: dict[str, Any]  # the response object, as it was sent
    # its input and output as chat messages (no instructions): what a follow-up continues
    conversation: list[dict[str, Any]]
    size: int


class ResponseStore:
    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self.used_bytes = 0
        self._entries: OrderedDict[tuple[str | None, str], Stored] = OrderedDict()
        self._lock = threading.Lock()  # written from the event loop, read from planning threads

    def put(self, tenant: str | None, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        size = len(dumps(response)) + len(dumps(conversation))
        if size > self.budget_bytes:
            return  # larger than the whole budget: never kept (a follow-up gets a clear 404)
        with self._lock:
            key = (tenant, response["id"])
            old = self._entries.pop(key, None)
            self.used_bytes -= old.size if old is not None else 0
            self._entries[key] = Stored(response, conversation, size)
            self.used_bytes += size
            while self.used_bytes > self.budget_bytes:
                _, evicted = self._entries.popitem(last=False)
                self.used_bytes -= evicted.size

    def get(self, tenant: str | None, response_id: str) -> Stored | None:
        with self._lock:
            stored = self._entries.get((tenant, response_id))
            if stored is not None:
                self._entries.move_to_end((tenant, response_id))
            return stored

    def delete(self, tenant: str | None, response_id: str) -> bool:
        with self._lock:
            stored = self._entries.pop((tenant, response_id), None)
            self.used_bytes -= stored.size if stored is not None else 0
            return stored is not None

    def __len__(self) -> int:
        return len(self._entries)
