"""Without an API key, only requests addressed to this server by a name it answers to: a guard
against DNS rebinding (a web page whose own name is made to resolve to 127.0.0.1, so that the
visitor's browser posts to this server as that page's origin)."""

from starlette.types import ASGIApp, Receive, Scope, Send

from batchproof.server.config import ServerConfig
from batchproof.server.errors import APIError, shown
from batchproof.server.guards.auth import OPEN_PATHS

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
ANY_ADDRESS = {"0.0.0.0", "::", ""}  # binds every interface: names no one host


def allowed_hosts(config: ServerConfig) -> frozenset[str] | None:
    """The Host names accepted (lower case, no port); None accepts any ('*')."""
    extra = [name.strip().lower() for name in (config.allowed_hosts or "").split(",") if name.strip()]
    if "*" in extra:
        return None
    bound = config.host.lower()
    if ":" in bound and not bound.startswith("["):  # an IPv6 address is written in brackets in a Host
        bound = f"[{bound}]"
    return LOOPBACK_NAMES | set(extra) | ({bound} if config.host not in ANY_ADDRESS else set())


def host_name(host: str) -> str:
    """'Example.com:8080' -> 'example.com'; '[::1]:8080' -> '[::1]'."""
    host = host.strip().lower()
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class RequireKnownHost:
    """A request whose Host is not one of `hosts` is a 403 before anything is read. /health and
    /metrics stay open to probes and scrapers that address the server by its IP. A request with
    no Host at all (HTTP/1.0) passes: a browser always sends one."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str]) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = dict(scope["headers"]).get(b"host")
            if given is not None and host_name(given.decode("latin-1")) not in self.hosts:
                error = APIError(403, f"Host {shown(given.decode('latin-1'))} is not a name this server answers to "
                                      "without an API key (--allowed-hosts adds names; or set an API key)",
                                 param="host", type_="permission_error", code="host_not_allowed")
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
