"""A request body is read only when it is declared JSON (a 415 in OpenAI's envelope otherwise)."""

from starlette.types import ASGIApp, Receive, Scope, Send

from batchproof.server.errors import APIError, shown

JSON_TYPE = "application/json"


def has_body(headers: dict[bytes, bytes]) -> bool:
    length = headers.get(b"content-length")
    return b"transfer-encoding" in headers or (length is not None and length.strip() not in (b"", b"0"))


class RequireJSON:
    """A POST whose body is not `Content-Type: application/json` (parameters such as charset
    allowed) is refused before it is read. A browser sends `text/plain` or a form from any web
    page without asking the server first (a "simple" request, no CORS preflight); JSON it cannot
    send that way. A POST without a body passes: the route says what it lacks."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = dict(scope["headers"])
            declared = headers.get(b"content-type", b"").decode("latin-1")
            media_type = declared.split(";", 1)[0].strip().lower()
            if media_type != JSON_TYPE and has_body(headers):
                error = APIError(415, f"Content-Type {shown(declared) if declared else '(none)'} is not "
                                      f"{JSON_TYPE}: send the body as JSON with 'Content-Type: {JSON_TYPE}'",
                                 param="content-type", code="unsupported_media_type")
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
