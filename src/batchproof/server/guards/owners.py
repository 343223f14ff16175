"""Who sent each request in flight, so that /abort_requests lets a tenant end its own requests
and no one else's."""

from collections.abc import AsyncIterator, Callable
from typing import TypeVar

T = TypeVar("T")


class Owners:
    """Each reply id in flight -> the id of the key that sent it (auth.tenant; None without keys).
    An id is named as the engine's abort matches it: a reply's id, a choice's engine id (the
    reply's and "-index") or a Responses id (resp_<hex> for the reply resp-<hex>)."""

    def __init__(self) -> None:
        self._owner_of: dict[str, str | None] = {}

    def hold(self, request_id: str, owner: str | None, stream: AsyncIterator[T]) -> AsyncIterator[T]:
        """`stream`, with `request_id` owned by `owner` until the stream ends or is closed."""
        self._owner_of[request_id] = owner
        return _Held(stream, lambda: self._owner_of.pop(request_id, None))

    def owned_by(self, owner: str | None) -> list[str]:
        return [request_id for request_id, who in self._owner_of.items() if who == owner]

    def split(self, owner: str | None, ids: list[str]) -> tuple[list[str], list[str]]:
        """`ids` -> (those of `owner`'s requests in flight, those of someone else's); ids of
        no request in flight are in neither."""
        mine, theirs = [], []
        for given in ids:
            reply_id = self._reply_id(given)
            if reply_id is not None:
                (mine if self._owner_of[reply_id] == owner else theirs).append(given)
        return mine, theirs

    def _reply_id(self, given: str) -> str | None:
        for candidate in (given, given.rpartition("-")[0], given.replace("_", "-", 1)):
            if candidate in self._owner_of:
                return candidate
        return None


class _Held:
    """An async iterator that calls `release` once it is exhausted or closed, closed before its
    first item included (an async generator's `finally` would not run then)."""

    def __init__(self, stream: AsyncIterator[T], release: Callable[[], object]) -> None:
        self._stream = stream
        self._release = release

    def __aiter__(self) -> "_Held":
        return self

    async def __anext__(self) -> T:
        try:
            return await self._stream.__anext__()
        except StopAsyncIteration:
            self._release()
            raise

    async def aclose(self) -> None:
        self._release()
        await self._stream.aclose()
