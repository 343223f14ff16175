"""How the server holds connections: a socket costs nothing until it sends a request, and a
slow client holds no one's place. uvicorn bounds neither by itself: its `limit_concurrency`
counts open connections, so 520 sockets that sent nothing made /health and every request a
503 for as long as they stayed open, and a connection that never completes its request head
(or trickles its body a byte a second) is kept forever and holds off a graceful exit.

Here a connection is closed when its request head is not whole within HEAD_TIMEOUT_S of the
first byte it owes (the connection's start, or the first byte after a keep-alive pause);
a body's deadline is the body limit's (body_limit.py); a graceful exit closes at once the
connections still sending a request; and what is bounded is requests in flight
(`--max-concurrent-requests`, `ConcurrencyLimit`), never connections."""

import asyncio
import resource

import h11
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from batchproof.server.errors import APIError

# An idle keep-alive connection is closed after this long, and so is one that has not sent a
# whole request head this long after it opened (or after its first byte following a reply).
KEEP_ALIVE_S = 5
HEAD_TIMEOUT_S = 5
# h11 (not httptools, which sets no bound) refuses a request head larger than this before it is whole.
MAX_REQUEST_HEAD_BYTES = 64 * 1024
# Answered whatever the load: a probe that saw 503 would take a busy server out of rotation.
UNCOUNTED_PATHS = frozenset({"/health", "/metrics"})


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline on the request head and a graceful exit that does
    not wait for a request still being sent."""

    head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def _awaiting_head(self) -> bool:
        return self.conn.their_state is h11.IDLE and not self.transport.is_closing()

    def _watch_head(self) -> None:
        """A head owed and no deadline: start one; the head arrived: stop it. While a connection
        is idle between requests the keep-alive timer runs instead (data_received stops that one
        at the next byte, and this starts the head's)."""
        if not self._awaiting_head():
            self._stop_head_timer()
        elif self.head_timer is None and self.timeout_keep_alive_task is None:
            self.head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self._awaiting_head():
            self.transport.close()

    def shutdown(self) -> None:
        # A client still sending its request has nothing to lose: closed now, where uvicorn would
        # wait for its body (forever, at a byte a second).
        if self.cycle is not None and not self.cycle.response_complete and self.conn.their_state is h11.SEND_BODY:
            self.transport.close()
            return
        super().shutdown()


class ConcurrencyLimit:
    """At most `limit` requests in flight (streams included); past it a new request is a 503 at
    once. /health and /metrics are not counted."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNCOUNTED_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            error = APIError(503, f"{self.in_flight} requests are in flight, the most this server takes "
                                  "(--max-concurrent-requests); retry later", type_="service_unavailable",
                             headers={"Retry-After": "1"})
            await error.response()(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


def uvicorn_config(app, host: str, port: int):
    import uvicorn

    # limit_concurrency stays off: it counts connections (ConcurrencyLimit counts requests).
    return uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, http=GuardedH11,
                          h11_max_incomplete_event_size=MAX_REQUEST_HEAD_BYTES, timeout_keep_alive=KEEP_ALIVE_S)


def raise_open_files_limit() -> int:
    """Each connection is a file descriptor: the soft limit (often 1,024) raised to the hard one,
    so thousands of idle sockets are closed by their deadline, not refused by the kernel."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            pass
    return soft
