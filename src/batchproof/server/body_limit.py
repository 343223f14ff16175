"""The request body's size limit, enforced before the body is read (a 413 in OpenAI's envelope)."""

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from batchproof.server.errors import APIError


def too_large(limit_bytes: int, size: str) -> APIError:
    return APIError(413, f"the request body is {size} bytes; this server reads at most {limit_bytes} "
                         "(--max-request-mb)", code="request_too_large")


class BodyLimit:
    """A declared Content-Length over the limit is refused before one byte is read; a chunked
    body is counted as it arrives and refused the moment it passes the limit, so neither the
    memory nor the parsing of a 64 MB body is ever paid."""

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
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit_bytes:
                    # Raised inside the route's `await request.body()`: its handler answers the 413.
                    raise too_large(self.limit_bytes, f"more than {self.limit_bytes}")
            return message

        await self.app(scope, counting_receive, send)
