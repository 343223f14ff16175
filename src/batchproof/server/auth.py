"""API keys: where they come from (a flag, a file, the environment) and the check on every
route but the probes'. Each key is a tenant: its id names its prefix-cache namespace."""

import hashlib
import os
import secrets
from pathlib import Path

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from batchproof.common.config import ConfigError
from batchproof.server.config import ServerConfig
from batchproof.server.errors import APIError

# Probes and scrapers may call these without the API key, as with vLLM.
OPEN_PATHS = {"/health", "/metrics"}
# As vLLM's VLLM_API_KEY: a key kept out of `ps` and shell history.
API_KEY_ENV = "BATCHPROOF_API_KEY"


def read_api_keys(api_key: str | None, api_key_file: Path | None) -> list[str]:
    """The keys the server accepts: --api-key, or one per line of --api-key-file (blank lines
    and '#' comments skipped), or $BATCHPROOF_API_KEY; [] means no key is required."""
    if api_key is not None and api_key_file is not None:
        raise ConfigError("give --api-key or --api-key-file, not both")
    if api_key_file is not None:
        try:
            lines = api_key_file.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"api_key_file {api_key_file}: cannot read it ({e})") from None
        keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        if not keys:
            raise ConfigError(f"api_key_file {api_key_file}: holds no key")
        return keys
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    if key is not None and not key.strip():
        raise ConfigError("the API key must not be blank")
    return [] if key is None else [key]


def server_api_keys(config: ServerConfig) -> list[str]:
    """The keys `config` accepts, once the settings that need a key have one: load_weights reads
    files on the server's machine, so an open server (or a web page its browser is tricked into
    posting from) must never reach it."""
    keys = read_api_keys(config.api_key, config.api_key_file)
    if config.allow_weight_updates and not keys:
        raise ConfigError("--allow-weight-updates needs an API key (--api-key, --api-key-file or "
                          f"${API_KEY_ENV}): load_weights reads files on this machine")
    return keys


def key_id(key: str) -> str:
    """A name for a key that does not reveal it (the prefix cache's namespace, logs)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def tenant(request: Request) -> str | None:
    """The id of the API key that sent the request (None without keys)."""
    return getattr(request.state, "api_key_id", None)


class RequireAPIKey:
    """'Authorization: Bearer KEY' with any accepted key; the key's id goes to request.state."""

    def __init__(self, app: ASGIApp, api_keys: list[str]) -> None:
        self.app = app
        self.expected = [(f"Bearer {key}".encode(), key_id(key)) for key in api_keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            # Every key is compared, so the time taken says nothing about which one matched.
            matches = [ident for header, ident in self.expected if secrets.compare_digest(given, header)]
            if matches:  # on the open paths too: /health tells a key holder more
                scope.setdefault("state", {})["api_key_id"] = matches[0]
            elif scope["path"] not in OPEN_PATHS:
                error = APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                                 param="authorization", code="invalid_api_key")
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
