"""Our modules' import graph from the source (AST, no import run): every import at any depth,
one inside a function or under `if TYPE_CHECKING:` too, and the rooms of a folder (its modules
and sub-packages) that reach each other. The engine's, the server's and the whole package's room
tests read it."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def exists(name: str) -> bool:
    path = SRC / Path(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").exists()


def imports_in(code: str) -> set[str]:
    """Our modules that `code` names in any import, at any depth, type-only included:
    `from batchproof.x import y` names batchproof.x.y where that is a module, else batchproof.x."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("batchproof"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                names.add(full if exists(full) else node.module)
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names if alias.name.startswith("batchproof")}
    return names


def sibling_edges(folder: str, graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The arrows between the children (modules and packages) of `folder`, e.g. for
    'batchproof.engine': {'runner': {'cache', 'model', ...}, ...}."""
    edges: dict[str, set[str]] = {}
    prefix = folder + "."
    for source, targets in graph.items():
        if not source.startswith(prefix):
            continue
        child = source[len(prefix):].split(".")[0]
        for target in targets:
            if target.startswith(prefix) and (other := target[len(prefix):].split(".")[0]) != child:
                edges.setdefault(child, set()).add(other)
    return edges


def rooms_in_a_loop(edges: dict[str, set[str]]) -> set[str]:
    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        todo = list(edges.get(start, ()))
        while todo:
            current = todo.pop()
            if current not in seen:
                seen.add(current)
                todo.extend(edges.get(current, ()))
        return seen

    return {room for room in edges if room in reach(room)}
