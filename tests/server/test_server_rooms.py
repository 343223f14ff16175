"""The server's rooms: a few modules at the top (the app, its state and settings, serving, errors,
metrics, info) and the rest in folders by what they are for: `guards/` (keys, limits, hosts),
`request/` (from a body to engine inputs), `reply/` (from engine outputs to a reply),
`trainer/` (load_weights, the control plane, the notary), `tools/`, and one folder per endpoint.
A room is a top-level module or folder; no two rooms import each other, directly or round a
longer loop, so each can be read knowing only those below it. Every import counts, at any
depth, a type-only one too. The Responses store is its endpoint's own: no module outside
`responses/` imports it. The rule is derived from the tree, so a new module is covered by where
it is put."""

import ast
from pathlib import Path

SERVER = Path(__file__).resolve().parents[2] / "src" / "batchproof" / "server"
MAX_TOP_MODULES = 13
STORE = "responses.store"


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


def exists(module: str) -> bool:
    path = SERVER / Path(*module.split("."))
    return path.is_dir() or path.with_suffix(".py").exists()


def source(module: str) -> Path:
    path = SERVER / Path(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def edges_in(code: str) -> set[str]:
    """The server's modules that `code` names in any import, at any depth, `if TYPE_CHECKING:`
    included: `from batchproof.server.x import y` names x.y where that is a module, else x."""
    edges = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("batchproof.server"):
            base = (node.module or "").removeprefix("batchproof.server").removeprefix(".")
            for alias in node.names:
                name = f"{base}.{alias.name}".lstrip(".")
                edges.add(name if exists(name) else base)
        elif isinstance(node, ast.Import):
            edges |= {a.name.removeprefix("batchproof.server.") for a in node.names
                      if a.name.startswith("batchproof.server.")}
    return {edge for edge in edges if edge}


def room(module: str) -> str:
    return module.split(".")[0]


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Room -> the other rooms its modules import."""
    rooms: dict[str, set[str]] = {}
    for module, edges in graph.items():
        rooms.setdefault(room(module), set()).update(room(e) for e in edges if room(e) != room(module))
    return rooms


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


MODULES = server_modules()
GRAPH = {m: edges_in(source(m).read_text()) for m in MODULES}


def test_the_top_holds_few_modules():
    top = sorted(p.stem for p in SERVER.glob("*.py") if p.stem != "__init__")
    assert len(top) <= MAX_TOP_MODULES, f"{len(top)} modules at the server's top: {top}; put them in a room"


def test_every_room_is_there():
    folders = {p.name for p in SERVER.iterdir() if (p / "__init__.py").exists()}
    assert {"guards", "request", "reply", "trainer", "tools", "chat", "completions", "responses"} <= folders


def test_no_two_rooms_import_each_other():
    assert loops(room_graph(GRAPH)) == []


def test_only_the_responses_endpoint_holds_its_store():
    assert STORE in MODULES
    outside = sorted(m for m, edges in GRAPH.items() if STORE in edges and room(m) != "responses")
    assert outside == []


def test_the_rule_can_fail():
    """A type-only import of the state from a guard, with the state importing the guards, is a
    loop of two rooms; a chain is none; an import of the store is seen by `from ... import`."""
    code = (
        "from typing import TYPE_CHECKING\n"
        "from batchproof.server.responses import store\n"
        "if TYPE_CHECKING:\n"
        "    from batchproof.server.state import ServerState\n"
    )
    assert edges_in(code) == {"responses.store", "state"}
    graph = {"guards.auth": edges_in(code), "state": {"guards.owners"}, "guards.owners": set()}
    assert loops(room_graph(graph)) == [["guards", "state"]]
    assert loops(room_graph({"app": {"state"}, "state": {"guards.owners"}, "guards.owners": set()})) == []
    assert loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
