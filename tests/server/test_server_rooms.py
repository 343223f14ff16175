"""The server's rooms: a few modules at the top (the app, its state and settings, serving, errors,
metrics, info) and the rest in folders by what they are for: `guards/` (keys, limits, hosts),
`request/` (from a body to engine inputs), `reply/` (from engine outputs to a reply),
`trainer/` (load_weights, the control plane, the notary), `tools/`, and one folder per endpoint.
A room is a top-level module or folder; no two rooms import each other, directly or round a
longer loop, so each can be read knowing only those below it. Every import counts, at any
depth, a type-only one too. The Responses store is its endpoint's own: no module outside
`responses/` imports it. The rule is derived from the tree, so a new module is covered by where
it is put."""

from tests.helpers.import_graph import SRC, imports_in, module_name, rooms_in_a_loop, sibling_edges

SERVER = SRC / "batchproof" / "server"
MAX_TOP_MODULES = 13
STORE = "batchproof.server.responses.store"

GRAPH = {module_name(path): imports_in(path.read_text()) for path in SERVER.rglob("*.py")}


def room(module: str) -> str:
    """A server module's room: its top-level module or folder ('chat' for batchproof.server.chat.plan)."""
    return module.removeprefix("batchproof.server").lstrip(".").split(".")[0]


def test_the_top_holds_few_modules():
    top = sorted(p.stem for p in SERVER.glob("*.py") if p.stem != "__init__")
    assert len(top) <= MAX_TOP_MODULES, f"{len(top)} modules at the server's top: {top}; put them in a room"


def test_every_room_is_there():
    folders = {p.name for p in SERVER.iterdir() if (p / "__init__.py").exists()}
    assert {"guards", "request", "reply", "trainer", "tools", "chat", "completions", "responses"} <= folders


def test_no_two_rooms_import_each_other():
    assert rooms_in_a_loop(sibling_edges("batchproof.server", GRAPH)) == set()


def test_only_the_responses_endpoint_holds_its_store():
    assert STORE in GRAPH
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
    assert imports_in(code) == {STORE, "batchproof.server.state"}
    s = "batchproof.server."
    graph = {s + "guards.auth": imports_in(code), s + "state": {s + "guards.owners"}, s + "guards.owners": set()}
    assert rooms_in_a_loop(sibling_edges("batchproof.server", graph)) == {"guards", "state"}
    chain = {s + "app": {s + "state"}, s + "state": {s + "guards.owners"}, s + "guards.owners": set()}
    assert rooms_in_a_loop(sibling_edges("batchproof.server", chain)) == set()
    assert rooms_in_a_loop({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {"a", "b", "c"}
