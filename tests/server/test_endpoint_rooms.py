"""The server by endpoint: each endpoint is a package (`chat/`, `completions/`, `responses/`,
`trainer/`) or module (`admin`) that imports what the endpoints share (the server's top and its
shared rooms: guards/, request/, reply/, tools/) and no other endpoint, and the shared modules
import no endpoint. The few edges between them are listed with why. Every import counts, a
function's and a type-only one too; the rule is derived from the folders, so a new module is
covered by where it is put. The rooms' own rule (no loop between any two) is
tests/server/test_server_rooms.py."""

import ast
from pathlib import Path

SERVER = Path(__file__).resolve().parents[2] / "src" / "batchproof" / "server"
ENDPOINTS = ("chat", "completions", "responses", "admin", "trainer")
# (importing module, imported endpoint) -> why. Keep it short.
KNOWN = {
    ("responses.route", "chat"): "the Responses API is a translation planned by chat's plan_chat, one way",
    ("responses.translate", "chat"): "the Responses request is translated into chat's request, one way",
    ("admin", "chat"): "/tokenize renders messages as the chat route does (chat/messages.py)",
    ("app", "chat"): "the app includes every endpoint's router",
    ("app", "completions"): "the app includes every endpoint's router",
    ("app", "responses"): "the app includes every endpoint's router, and gives the Responses API its store",
    ("app", "admin"): "the app includes every endpoint's router",
    ("app", "trainer"): "the app includes every endpoint's router",
    ("openapi", "chat"): "the OpenAPI document names every endpoint's request model",
    ("openapi", "completions"): "the OpenAPI document names every endpoint's request model",
    ("openapi", "responses"): "the OpenAPI document names every endpoint's request model",
    ("openapi", "admin"): "the OpenAPI document names every endpoint's request model",
}


def server_modules() -> list[str]:
    """Names relative to the server, e.g. 'chat.plan', 'serving'; a package by its folder."""
    names = []
    for path in SERVER.rglob("*.py"):
        parts = list(path.relative_to(SERVER).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            names.append(".".join(parts))
    return sorted(names)


def endpoint(module: str) -> str | None:
    first = module.split(".")[0]
    return first if first in ENDPOINTS else None


def imported(module: str) -> set[str]:
    """The server's modules (or packages) `module` names in any import, at any depth."""
    path = SERVER / Path(*module.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    names = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("batchproof.server"):
            base = (node.module or "").removeprefix("batchproof.server").removeprefix(".")
            names |= {f"{base}.{alias.name}".lstrip(".") for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name.removeprefix("batchproof.server.") for a in node.names
                      if a.name.startswith("batchproof.server.")}
    return names


def test_the_endpoints_and_the_shared_top_import_no_other_endpoint() -> None:
    modules = server_modules()
    assert {"chat.route", "chat.plan", "chat.protocol", "completions.route", "completions.plan",
            "completions.protocol", "responses.route", "admin", "trainer.control"} <= set(modules)
    unexpected = []
    for module in modules:
        for name in imported(module):
            target = endpoint(name)
            if target is None or target == endpoint(module):
                continue
            if (module, target) not in KNOWN:
                unexpected.append(f"{module} -> {name}")
    assert unexpected == []


def test_every_known_edge_still_exists() -> None:
    """An edge listed as known that the code no longer has is a stale excuse."""
    edges = {(module, endpoint(name)) for module in server_modules() for name in imported(module)}
    assert set(KNOWN) <= edges
