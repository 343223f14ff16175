"""API errors in OpenAI's envelope, and the mapping from validation failures to status codes."""

from pydantic import ValidationError
from starlette.responses import JSONResponse

# Structural problems with these fields are 400s (the request is not a request);
# type and range errors on any other field are 422s, as the spec's table says.
STRUCTURAL_FIELDS = {"messages", "prompt", "tokens"}


MAX_MESSAGE_CHARS = 1000  # an error never echoes a request back at length


def shown(value: object) -> str:
    """A value as an error message quotes it: its repr, cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        if len(message) > MAX_MESSAGE_CHARS:  # the head says what, the tail says the limit
            message = message[:MAX_MESSAGE_CHARS // 2] + " ... " + message[-MAX_MESSAGE_CHARS // 2:]
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type_
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def from_validation_error(error: ValidationError) -> APIError:
    """The first problem pydantic found, as an APIError naming the field and the value."""
    first = error.errors()[0]
    loc = [str(part) for part in first["loc"]]
    if first["type"] == "json_invalid":
        return APIError(400, f"request body is not valid JSON: {first['ctx']['error']}")
    if not loc:
        return APIError(400, f"request body must be a JSON object, got {shown(first.get('input'))}")
    field = loc[0]
    where = ".".join(loc)
    if first["type"] == "missing":
        return APIError(400, f"'{where}' is required", param=field)
    if first["type"] == "extra_forbidden":
        return APIError(400, f"'{where}' is not a field batchproof supports (unknown fields are refused, "
                             "not ignored; see docs/api-fields.md)", param=field)
    if first["type"] == "unsupported":
        return APIError(400, f"'{where}' ({shown(first.get('input'))}) is {first['msg']}", param=field)
    status = 400 if field in STRUCTURAL_FIELDS else 422
    return APIError(status, f"invalid value {shown(first.get('input'))} for '{where}': {first['msg']}", param=field)


def count_mismatch(num_entries: int, num_tokens: int) -> APIError:
    """Fail closed: a reply whose logprobs do not number its tokens is never sent as a 200."""
    return APIError(500, f"logprobs fail closed: {num_entries} entries for {num_tokens} reply tokens",
                    type_="server_error")
