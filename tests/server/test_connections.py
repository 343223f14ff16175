"""Connections cost nothing until they send a request (server/guards/connections.py, body_limit.py):
thousands of idle sockets leave /health and real requests answering; a connection without a
whole request head, or a body not whole by its deadline, is closed; the bound is on requests in
flight, not on connections; a graceful exit does not wait for a client still sending. The
deadlines are shortened here (monkeypatched) so that nothing waits seconds for them."""

import contextlib
import socket
import threading

import httpx
import pytest
import uvicorn

from batchproof.engine.config import EngineConfig
from batchproof.server.app import create_app
from batchproof.server.config import ServerConfig
from batchproof.server.guards import body_limit, connections
from batchproof.server.guards.connections import MAX_REQUEST_HEAD_BYTES, raise_open_files_limit, uvicorn_config
from tests.helpers.http import chat_body, wait_until
from tests.helpers.live_server import live_server

CHAT = "/v1/chat/completions"
NUM_IDLE = 2000


def _closed_by_server(sock: socket.socket, timeout: float = 10) -> bytes:
    """What the server sent before closing `sock` (b'' for a silent close); fails if it stays open."""
    sock.settimeout(timeout)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def test_two_thousand_idle_sockets_leave_health_and_chat_answering(engine) -> None:
    raise_open_files_limit()  # this process holds both ends of every socket
    with live_server(engine) as live:
        idle = []
        try:
            for _ in range(NUM_IDLE):
                idle.append(socket.create_connection(_address(live.url)))
            # Every one accepted: a request made now waits behind none of them.
            assert httpx.get(live.url + "/health", timeout=30).status_code == 200
            reply = httpx.post(live.url + CHAT, json=chat_body("Hi", max_tokens=2), timeout=60)
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["message"]["content"]
        finally:
            for sock in idle:
                sock.close()


def test_a_connection_without_a_whole_request_head_is_closed(engine, monkeypatch) -> None:
    monkeypatch.setattr(connections, "HEAD_TIMEOUT_S", 0.3)
    with live_server(engine) as live:
        with socket.create_connection(_address(live.url)) as silent:
            assert _closed_by_server(silent) == b""
        with socket.create_connection(_address(live.url)) as partial:
            partial.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")  # the blank line never comes
            assert _closed_by_server(partial) == b""
        # A whole head is answered and the connection kept alive until its keep-alive ends.
        with socket.create_connection(_address(live.url)) as whole:
            whole.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            whole.settimeout(10)
            assert whole.recv(64).startswith(b"HTTP/1.1 200")


def test_a_head_that_never_ends_is_refused_once_it_passes_the_bound(engine) -> None:
    with live_server(engine) as live, socket.create_connection(_address(live.url), timeout=10) as endless:
        endless.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Padding: " + b"a" * (2 * MAX_REQUEST_HEAD_BYTES))
        assert endless.recv(64).startswith(b"HTTP/1.1 400")


def test_a_trickled_body_gets_a_408_and_the_connection_closes(engine, monkeypatch) -> None:
    monkeypatch.setattr(body_limit, "BODY_BASE_S", 0.5)
    with live_server(engine) as live, socket.create_connection(_address(live.url)) as slow:
        slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"mess")
        answer = _closed_by_server(slow)
        assert answer.startswith(b"HTTP/1.1 408")
        assert b"request_timeout" in answer and b"not whole within" in answer


def test_requests_in_flight_are_bounded_not_connections(engine) -> None:
    with live_server(engine, max_concurrent_requests=2) as live:
        idle = [socket.create_connection(_address(live.url)) for _ in range(5)]
        held = [socket.create_connection(_address(live.url)) for _ in range(2)]
        try:
            assert httpx.get(live.url + "/health").status_code == 200  # five idle sockets: nothing in flight
            assert httpx.post(live.url + CHAT, json=chat_body("Hi", max_tokens=1), timeout=60).status_code == 200
            for sock in held:  # two requests whose bodies have not come: both in flight
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                             b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n")
            assert wait_until(lambda: httpx.post(live.url + CHAT, json=chat_body("Hi", max_tokens=1),
                                                 timeout=60).status_code == 503, timeout=10)
            refused = httpx.post(live.url + CHAT, json=chat_body("Hi", max_tokens=1), timeout=60)
            assert refused.json()["error"]["type"] == "service_unavailable"
            assert "--max-concurrent-requests" in refused.json()["error"]["message"]
            assert httpx.get(live.url + "/health").status_code == 200  # probes are not counted
        finally:
            for sock in idle + held:
                sock.close()
        assert wait_until(lambda: httpx.post(live.url + CHAT, json=chat_body("Hi", max_tokens=1),
                                             timeout=60).status_code == 200, timeout=10)


def test_a_graceful_exit_is_not_held_by_a_client_still_sending(engine) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = ServerConfig(host="127.0.0.1", port=port)
    server = uvicorn.Server(uvicorn_config(create_app(config, EngineConfig(device="cpu"), engine=engine),
                                           "127.0.0.1", port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    with contextlib.ExitStack() as stack:
        assert wait_until(lambda: server.started, timeout=30)
        assert wait_until(lambda: httpx.get(url + "/health").status_code == 200, timeout=30)
        slow = stack.enter_context(socket.create_connection(("127.0.0.1", port)))
        slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 8000000\r\n\r\n{")
        assert wait_until(lambda: len(server.server_state.tasks) == 1, timeout=10)
        server.should_exit = True
        # The body's deadline for 8,000,000 bytes is 40 s; the exit does not wait for it (20 s of
        # slack for a busy machine: the exit takes well under a second).
        thread.join(timeout=20)
        assert not thread.is_alive(), "the server's exit waited for a body still being sent"
        assert _closed_by_server(slow, timeout=5) == b""


@pytest.mark.parametrize("limit", [0, -1])
def test_max_concurrent_requests_must_be_positive(limit) -> None:
    from batchproof.common.config import ConfigError

    with pytest.raises(ConfigError, match="max_concurrent_requests must be >= 1"):
        ServerConfig(max_concurrent_requests=limit)
