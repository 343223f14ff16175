"""The engine's rooms: its top-level modules and packages, each arrow between them listed here.
A room imports only the rooms it is listed with, and no two rooms (at any folder depth: the
engine's, the model's, the cache's, ...) reach each other through imports. Every import counts,
one inside a function or under `if TYPE_CHECKING:` too: a type-only import is still a reader
who must open the other file. The rule is derived from the folders, so a new module is covered
by where it is put, and a new arrow is a line added here on purpose."""

import pytest

from tests.helpers.import_graph import SRC, imports_in, module_name, rooms_in_a_loop, sibling_edges

ENGINE = SRC / "batchproof" / "engine"
MAX_TOP_LEVEL_MODULES = 12  # issue 59: the step loop's ground floor, the rest in its packages

# room -> the engine's rooms it may import. From the bottom: sampling (params, sampler, logprobs,
# the constraint) imports nothing of ours; text the records; the model its text, caches and
# sampling's pure functions; a Sequence its drafter, text stream and grammar state; the
# step's parts the sequence; engine.py everything; async_engine and its inbox the engine.
ALLOWED = {
    "sampling": set(),
    "memory": set(),
    "config": set(),
    "text": {"sampling"},
    "grammar": {"sampling", "text"},
    "draft": set(),
    "cache": {"memory", "sampling", "sequence"},
    "model": {"cache", "config", "memory", "sampling", "text"},
    "sequence": {"draft", "grammar", "sampling", "text"},
    "scheduler": {"cache", "sequence"},
    "runner": {"cache", "model", "sampling", "sequence"},
    "outputs": {"grammar", "sampling", "sequence", "text"},
    "speculative": {"draft", "outputs", "sequence"},
    "weight_versions": {"outputs", "sequence"},
    "engine": {"cache", "config", "draft", "grammar", "memory", "model", "outputs", "runner", "sampling",
               "scheduler", "sequence", "speculative", "text", "weight_versions"},
    "rollout_scoring": {"engine", "sampling"},
    "replay": {"engine", "grammar", "memory", "model", "outputs", "runner", "sampling", "sequence", "text"},
    "inbox": {"engine", "sampling"},
    "async_engine": {"engine", "inbox", "outputs", "sampling"},
}


GRAPH = {module_name(path): imports_in(path.read_text()) for path in ENGINE.rglob("*.py")}


FOLDERS = sorted(module_name(path.parent) for path in ENGINE.rglob("__init__.py"))
TOP = sibling_edges("batchproof.engine", GRAPH)


def test_the_ground_floor_is_small():
    modules = sorted(p.stem for p in ENGINE.glob("*.py") if p.stem != "__init__")
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, modules


def test_every_room_is_listed():
    rooms = {p.stem for p in ENGINE.glob("*.py") if p.stem != "__init__"} | {
        p.parent.name for p in ENGINE.glob("*/__init__.py")}
    assert rooms == set(ALLOWED), f"add each new room to ALLOWED with its arrows: {sorted(rooms ^ set(ALLOWED))}"


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_a_room_imports_only_its_listed_rooms(room):
    extra = TOP.get(room, set()) - ALLOWED[room]
    assert not extra, f"engine/{room} imports {sorted(extra)}; allowed: {sorted(ALLOWED[room])}"


def test_every_listed_arrow_is_still_drawn():
    """An arrow no longer drawn is taken off the list, so the list stays the map."""
    assert {room: TOP.get(room, set()) for room in ALLOWED} == ALLOWED


def test_a_sequence_is_the_engine_s_own():
    """`Sequence` is the engine's private request state: what leaves the engine is outputs.py's
    RequestOutput, so no module outside the engine imports sequence.py."""
    outside = {module_name(path): imports_in(path.read_text()) for path in (SRC / "batchproof").rglob("*.py")
               if ENGINE not in path.parents}
    assert not {m for m, names in outside.items() if "batchproof.engine.sequence" in names}


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_two_rooms_reach_each_other(folder):
    edges = sibling_edges(folder, GRAPH)
    loop = rooms_in_a_loop(edges)
    assert not loop, f"{folder}: {sorted(loop)} reach each other: " + "; ".join(
        f"{a} -> {sorted(edges[a] & loop)}" for a in sorted(loop))


def test_the_rule_can_fail():
    """A type-only import closes a loop as surely as a real one; an import inside a function too."""
    code = ("from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    from batchproof.engine.cache.manager import Reused\n"
            "def f():\n"
            "    from batchproof.engine import sequence\n")
    assert imports_in(code) == {"batchproof.engine.cache.manager", "batchproof.engine.sequence"}
    graph = {"batchproof.engine.sequence": {"batchproof.engine.cache.manager"},
             "batchproof.engine.cache.manager": {"batchproof.engine.sequence"},
             "batchproof.engine.scheduler": {"batchproof.engine.sequence"}}
    edges = sibling_edges("batchproof.engine", graph)
    assert edges == {"sequence": {"cache"}, "cache": {"sequence"}, "scheduler": {"sequence"}}
    assert rooms_in_a_loop(edges) == {"sequence", "cache"}
