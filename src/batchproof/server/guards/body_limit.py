"""What a request body may cost: its size, refused before it is read (a 413 in OpenAI's
envelope), and its time, so that a body trickled a byte a second holds no connection forever
(a 408 and the connection closed)."""

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from batchproof.server.errors import APIError

# A body's deadline: this long, plus its length at this rate (the declared length, or the limit
# for a chunked one): 8 MiB in 42 s, a small body in 10 s; any real client on any real link
# sends faster, and a slow-loris client is cut off.
BODY_BASE_S = 10.0
BODY_MIN_BYTES_PER_S = 256 * 1024


def too_large(limit_bytes: int, size: str) -> APIError:
    return APIError(413, f"the request body is {size} bytes; this server reads at most {limit_bytes} "
                         "(--max-request-mb)", code="request_too_large")


def too_slow(deadline_s: float, received: int) -> APIError:
    # "Connection: close": h11 then ends the connection after the reply, unread body and all.
    return APIError(408, f"the request body was not whole within {deadline_s:.0f} s ({received} bytes received)",
                    code="request_timeout", headers={"Connection": "close"})


class BodyLimit:
    """A declared Content-Length over the limit is refused before one byte is read; a chunked
    body is counted as it arrives and refused the moment it passes the limit, so neither the
    memory nor the parsing of a 64 MB body is ever paid. A body not whole by its deadline is a
    408 (raised inside the route's `await request.body()`, whose handler answers it)."""

    def __init__(self, app: ASGIApp, limit_bytes: int) -> None:
        self.app = app
        self.limit_bytes = limit_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit_bytes:
            await too_large(self.limit_bytes, declared.decode()).response()(scope, receive, send)
            return
        expected = int(declared) if declared is not None and declared.isdigit() else self.limit_bytes
        deadline_s = BODY_BASE_S + expected / BODY_MIN_BYTES_PER_S
        deadline = asyncio.get_running_loop().time() + deadline_s
        received = 0
        body_done = False

        async def counting_receive() -> Message:
            nonlocal received, body_done
            if body_done:  # what follows the body (a disconnect) has no deadline
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise too_slow(deadline_s, received) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if received > self.limit_bytes:
                    raise too_large(self.limit_bytes, f"more than {self.limit_bytes}")
            return message

        await self.app(scope, counting_receive, send)
