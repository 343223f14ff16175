"""The probe's two rooms: `wire/` speaks to the server, `judge/` judges what came back, and the
only thing between them is `records/` (the reply, its entries, its arrival times, a message).
A judge reaches no wire module, not even through another module of ours, and the wire no
judge; the records reach neither room. Every import counts, a type-only one too. The rule is
derived from the folders, so a new module is covered by where it is put."""

import ast
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parents[2] / "src" / "batchproof" / "probe"
ROOMS = ("wire", "judge", "records")

# room -> the probe's rooms it may import (itself included); "top" is run, mode, config, ...
ALLOWED = {
    "judge": {"judge", "records"},
    "wire": {"wire", "records"},
    "records": {"records"},
}
# Edges out of a room that are not a room's, each with why. Keep it short.
KNOWN = {
    ("wire.request", "matrix"): "request_body reads the run's settings (n_predict, temperature, seed)",
}


def probe_modules() -> list[str]:
    """Names relative to the probe, e.g. 'judge.verdict', 'run'; a package by its folder."""
    names = []
    for path in PROBE.rglob("*.py"):
        parts = list(path.relative_to(PROBE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            names.append(".".join(parts))
    return sorted(names)


def room(module: str) -> str:
    first = module.split(".")[0]
    return first if first in ROOMS else "top"


def exists(module: str) -> bool:
    path = PROBE / Path(*module.split("."))
    return path.is_dir() or path.with_suffix(".py").exists()


def edges_in(code: str) -> set[str]:
    """The probe's modules that `code` names in any import, at any depth, `if TYPE_CHECKING:`
    included: `from batchproof.probe.x import y` names x.y where that is a module, else x."""
    edges = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("batchproof.probe"):
            base = (node.module or "").removeprefix("batchproof.probe").removeprefix(".")
            for alias in node.names:
                name = f"{base}.{alias.name}".lstrip(".")
                edges.add(name if exists(name) else base)
        elif isinstance(node, ast.Import):
            edges |= {a.name.removeprefix("batchproof.probe.") for a in node.names
                      if a.name.startswith("batchproof.probe.")}
    return {edge for edge in edges if edge}


def source(module: str) -> Path:
    path = PROBE / Path(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def closure(module: str, graph: dict[str, set[str]]) -> set[str]:
    """Every module `module` reaches through imports, itself excluded."""
    seen: set[str] = set()
    todo = list(graph.get(module, ()))
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(graph.get(current, ()))
    return seen


def wrong_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Each room module's imports that leave what its room may import, known edges aside."""
    wrong = {}
    for module, edges in graph.items():
        if room(module) == "top":
            continue
        bad = {e for e in edges if room(e) not in ALLOWED[room(module)] and (module, e) not in KNOWN}
        if bad:
            wrong[module] = bad
    return wrong


MODULES = probe_modules()
GRAPH = {m: edges_in(source(m).read_text()) for m in MODULES}


def test_every_room_is_there():
    rooms = {room(m) for m in MODULES}
    assert rooms == {"top", *ROOMS}
    assert all(len([m for m in MODULES if room(m) == r]) >= 2 for r in ROOMS)


@pytest.mark.parametrize("module", [m for m in MODULES if room(m) != "top"])
def test_a_room_imports_only_what_it_may(module):
    assert not wrong_edges({module: GRAPH[module]}), (
        f"probe.{module} ({room(module)}) may import only {sorted(ALLOWED[room(module)])} of the probe, "
        f"not {sorted(wrong_edges({module: GRAPH[module]})[module])}")


@pytest.mark.parametrize("module", [m for m in MODULES if room(m) == "judge"])
def test_a_judge_never_reaches_the_wire(module):
    assert not {m for m in closure(module, GRAPH) if room(m) == "wire"}


@pytest.mark.parametrize("module", [m for m in MODULES if room(m) == "wire"])
def test_the_wire_never_reaches_a_judge(module):
    assert not {m for m in closure(module, GRAPH) if room(m) == "judge"}


def test_known_edges_are_still_there():
    """An exception that no longer happens is taken off the list."""
    assert all(target in GRAPH.get(module, ()) for module, target in KNOWN)


def test_the_rule_can_fail():
    """A judge importing the stream (even as a type, even by `from ... import module`) is caught;
    the same judge importing the reply record is not."""
    code = (
        "from typing import TYPE_CHECKING\n"
        "from batchproof.probe.records.reply import StreamResult\n"
        "if TYPE_CHECKING:\n"
        "    from batchproof.probe.wire import stream\n"
    )
    assert edges_in(code) == {"records.reply", "wire.stream"}
    assert wrong_edges({"judge.pair": edges_in(code)}) == {"judge.pair": {"wire.stream"}}
    graph = {"judge.a": {"records.b"}, "records.b": {"wire.c"}, "wire.c": set()}
    assert closure("judge.a", graph) == {"records.b", "wire.c"}
    assert wrong_edges(graph) == {"records.b": {"wire.c"}}
