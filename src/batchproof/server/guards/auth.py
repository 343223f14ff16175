"""API keys: where they come from (a flag, a file, the environment) and the check on every
route but the probes'. Each key is a tenant: its id names its prefix-cache namespace. One key,
the admin's, may also change what every tenant sees: pause, resume, abort others' requests and
load weights."""

import hashlib
import os
import secrets
from dataclasses import dataclass
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
ADMIN_KEY_ENV = "BATCHPROOF_ADMIN_API_KEY"


@dataclass(frozen=True)
class APIKeys:
    """The keys a server accepts: its tenants' and the admin's (a tenant of its own besides)."""

    tenant_keys: tuple[str, ...] = ()
    admin_key: str | None = None

    def __bool__(self) -> bool:  # as the list of keys it replaced: false when no key is required
        return bool(self.tenant_keys) or self.admin_key is not None


def _keys_in(path: Path, setting: str) -> list[str]:
    """The keys in a file, one per line; blank lines and '#' comments skipped."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{setting} {path}: cannot read it ({e})") from None
    keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise ConfigError(f"{setting} {path}: holds no key")
    return keys


def _one_key(key: str | None, env: str, what: str) -> str | None:
    """A key given on the command line, else from $env; None if neither."""
    key = key if key is not None else os.environ.get(env)
    if key is not None and not key.strip():
        raise ConfigError(f"the {what} must not be blank")
    return key


def read_api_keys(api_key: str | None, api_key_file: Path | None) -> list[str]:
    """The keys the server accepts: --api-key, or one per line of --api-key-file (blank lines
    and '#' comments skipped), or $BATCHPROOF_API_KEY; [] means no key is required."""
    if api_key is not None and api_key_file is not None:
        raise ConfigError("give --api-key or --api-key-file, not both")
    if api_key_file is not None:
        return _keys_in(api_key_file, "api_key_file")
    key = _one_key(api_key, API_KEY_ENV, "API key")
    return [] if key is None else [key]


def read_admin_key(admin_api_key: str | None, admin_api_key_file: Path | None) -> str | None:
    """--admin-api-key, or the one key in --admin-api-key-file, or $BATCHPROOF_ADMIN_API_KEY."""
    if admin_api_key is not None and admin_api_key_file is not None:
        raise ConfigError("give --admin-api-key or --admin-api-key-file, not both")
    if admin_api_key_file is not None:
        keys = _keys_in(admin_api_key_file, "admin_api_key_file")
        if len(keys) > 1:  # a second line is more likely a pasted tenant list than a second admin
            raise ConfigError(f"admin_api_key_file {admin_api_key_file}: holds {len(keys)} keys; give one")
        return keys[0]
    return _one_key(admin_api_key, ADMIN_KEY_ENV, "admin API key")


def server_api_keys(config: ServerConfig) -> APIKeys:
    """The keys `config` accepts, once the settings that need the admin key have one:
    load_weights reads files on the server's machine and pause holds every tenant's requests,
    so neither an open server (or a web page its browser is tricked into posting from) nor a
    tenant may reach them."""
    keys = APIKeys(tuple(read_api_keys(config.api_key, config.api_key_file)),
                   read_admin_key(config.admin_api_key, config.admin_api_key_file))
    if keys.admin_key is not None and keys.admin_key in keys.tenant_keys:
        raise ConfigError("the admin API key is also a tenant's API key: give the admin a key of its own")
    if config.allow_weight_updates and keys.admin_key is None:
        raise ConfigError("--allow-weight-updates needs an admin API key (--admin-api-key, --admin-api-key-file "
                          f"or ${ADMIN_KEY_ENV}): load_weights reads files on this machine and /pause holds "
                          "every tenant's requests")
    return keys


def key_id(key: str) -> str:
    """A name for a key that does not reveal it (the prefix cache's namespace, logs)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def tenant(request: Request) -> str | None:
    """The id of the API key that sent the request (None without keys)."""
    return getattr(request.state, "api_key_id", None)


def is_admin(request: Request) -> bool:
    return getattr(request.state, "is_admin", False)


def require_admin(request: Request) -> None:
    """A 403 unless the admin key sent the request: a tenant must not stop or change what the
    others are served."""
    if not is_admin(request):
        raise APIError(403, f"{request.url.path} needs the admin API key (--admin-api-key); this key is a "
                            "tenant's", type_="permission_error")


class RequireAPIKey:
    """'Authorization: Bearer KEY' with any accepted key; the key's id, and whether it is the
    admin's, go to request.state."""

    def __init__(self, app: ASGIApp, api_keys: APIKeys) -> None:
        self.app = app
        admin = [] if api_keys.admin_key is None else [api_keys.admin_key]
        self.expected = [(f"Bearer {key}".encode(), key_id(key), key in admin)
                         for key in [*api_keys.tenant_keys, *admin]]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            # Every key is compared, so the time taken says nothing about which one matched.
            matches = [(ident, admin) for header, ident, admin in self.expected
                       if secrets.compare_digest(given, header)]
            if matches:  # on the open paths too: /health tells a key holder more
                ident, admin = matches[0]
                scope.setdefault("state", {}).update(api_key_id=ident, is_admin=admin)
            elif scope["path"] not in OPEN_PATHS:
                error = APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                                 param="authorization", code="invalid_api_key")
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
