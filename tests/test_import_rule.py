"""The import rule, derived from the tree: a module's layer is the package it lives in.

    common  <- engine <- server <- commands (and cli)
               engine, server <- fleet <- commands
    common  <- probe
    common  <- check
    common, check <- report
    common, probe, check, report <- board
    common  <- notary <- server, commands

`common`, `probe`, `check`, `report`, `board` and `notary` import neither torch nor numpy, not even through another
module of ours, nor anything beyond the standard library and pyproject's base dependencies
(the light install, `pip install batchproof`, with the verbs it runs; the venv itself is tested in
tests/probe/test_light_install.py); the engine never imports the server; the probe and the check never
import each other; only the fleet imports ray (an optional extra), so the single server
never needs it. A new module is covered by where it is put.

No two modules of ours import each other, directly or round a longer loop (a cycle works
only while every import on it happens to run late enough, and it hid a broken import in
the bench). Every import counts, a function's too, since it runs when the function is
called; only one under `if TYPE_CHECKING:` does not, as it never runs. A package's
`__init__` that a submodule import loads first is not an edge: Python has the package in
sys.modules before the submodule runs.
"""

import ast
import re
import subprocess
import sys
import tomllib
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "batchproof"

# layer -> the layers of ours it may import (itself included)
ALLOWED = {
    "common": {"common"},
    "engine": {"common", "engine"},
    "server": {"common", "engine", "notary", "server"},
    "fleet": {"common", "engine", "server", "fleet"},
    "probe": {"common", "probe"},
    "check": {"common", "check"},
    "report": {"common", "check", "report"},
    "notary": {"common", "notary"},
    "board": {"common", "probe", "check", "report", "board"},
    "commands": {"common", "engine", "server", "fleet", "probe", "check", "report", "notary", "board", "commands"},
    "cli": {"commands"},
}
TORCH_FREE = {"common", "probe", "check", "report", "notary", "board"}
HEAVY = {"torch", "numpy"}
# What `pip install batchproof` (no extras) must run: these layers and these verbs.
LIGHT_VERBS = ["cli", "commands.extras", "commands.probe", "commands.check", "commands.report", "commands.models",
               "commands.board"]
PYPROJECT = PACKAGE.parent.parent / "pyproject.toml"


def all_modules() -> list[str]:
    """Dotted names of every module under src/batchproof, e.g. 'engine.model.transformer'."""
    names = []
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and parts != ["__main__"]:
            names.append(".".join(parts))
    return sorted(names)


def layer(module: str) -> str:
    return module.split(".")[0]


def source(module: str) -> Path:
    path = PACKAGE / Path(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def imports(module: str) -> tuple[set[str], set[str]]:
    """(modules of ours, top-level foreign packages) named by any import in `module`, at any depth."""
    ours, foreign = set(), set()
    for node in ast.walk(ast.parse(source(module).read_text())):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{module}: relative import"
            name = node.module or ""
            if name == "batchproof":
                ours |= {alias.name for alias in node.names}
            elif name.startswith("batchproof."):
                base = name.removeprefix("batchproof.")
                ours.add(base)
                # `from batchproof.x import y` may name a submodule y
                ours |= {f"{base}.{a.name}" for a in node.names if source_exists(f"{base}.{a.name}")}
            else:
                foreign.add(name.split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("batchproof."):
                    ours.add(alias.name.removeprefix("batchproof."))
                elif alias.name != "batchproof":
                    foreign.add(alias.name.split(".")[0])
    return ours, foreign


def source_exists(module: str) -> bool:
    path = PACKAGE / Path(*module.split("."))
    return path.is_dir() or path.with_suffix(".py").exists()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(node: ast.AST):
    """Every node under `node` that can run: all but the body of an `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:  # its else branch does run
                yield other
                yield from _runtime_nodes(other)
            continue
        yield child
        yield from _runtime_nodes(child)


def edges_in(code: str) -> set[str]:
    """Modules of ours that running `code` imports, at any depth: `from batchproof.x import y`
    imports the submodule x.y where there is one, else x."""
    edges = set()
    for node in _runtime_nodes(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "batchproof":
            base = (node.module or "").removeprefix("batchproof").removeprefix(".")
            for alias in node.names:
                name = f"{base}.{alias.name}".lstrip(".")
                edges.add(name if source_exists(name) else base)
        elif isinstance(node, ast.Import):
            edges |= {a.name.removeprefix("batchproof.") for a in node.names if a.name.startswith("batchproof.")}
    return {edge for edge in edges if edge and source_exists(edge)}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph` (module -> what it imports): each strongly connected
    component of more than one module, or of one that imports itself (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph.get(module, ()):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(component) > 1 or module in graph.get(module, ()):
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def closure(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        current = todo.pop()
        if current in seen or not source_exists(current):
            continue
        seen.add(current)
        todo.extend(imports(current)[0])
    return seen


MODULES = all_modules()


def test_every_module_has_a_layer():
    assert len(MODULES) > 40
    assert not [m for m in MODULES if layer(m) not in ALLOWED]


@pytest.mark.parametrize("module", MODULES)
def test_imports_point_down_the_layers(module):
    wrong = {m for m in imports(module)[0] if layer(m) not in ALLOWED[layer(module)]}
    assert not wrong, f"{module} ({layer(module)}) may import only {sorted(ALLOWED[layer(module)])}, not {wrong}"


@pytest.mark.parametrize("module", [m for m in MODULES if layer(m) in TORCH_FREE])
def test_torch_free_layers_never_reach_torch(module):
    heavy = {m: imports(m)[1] & HEAVY for m in closure(module)}
    assert not any(heavy.values()), {m: sorted(v) for m, v in heavy.items() if v}


@cache
def light_packages() -> frozenset[str]:
    """The top-level import names of pyproject's base dependencies (`yaml` for pyyaml), read
    from the distributions installed here (once: that walks every installed package)."""
    def normalized(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    base = {normalized(re.match(r"[A-Za-z0-9._-]+", r).group()) for r in
            tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]}
    return frozenset(module for module, distributions in metadata.packages_distributions().items()
                     if any(normalized(d) in base for d in distributions))


def beyond_the_light_install(module: str) -> set[str]:
    """Foreign packages that `module` imports, at any depth, which neither the standard library
    nor the light install has."""
    foreign = set().union(*(imports(m)[1] for m in closure(module)))
    return foreign - set(sys.stdlib_module_names) - light_packages()


@pytest.mark.parametrize("module", [m for m in MODULES if layer(m) in TORCH_FREE] + LIGHT_VERBS)
def test_the_light_install_has_all_the_probe_check_and_report_import(module):
    assert beyond_the_light_install(module) == set(), "add it to pyproject's dependencies, or import it lazily"


def test_the_light_rule_can_fail():
    """The light install's packages are found by their import names, and the server needs more."""
    assert {"httpx", "yaml", "rich"} <= light_packages()
    assert {"torch", "fastapi", "uvicorn"} <= beyond_the_light_install("commands.serve")


def test_the_rule_can_fail():
    """The checker sees a forbidden edge: the server imports the engine, not the reverse."""
    assert "engine" in {layer(m) for m in imports("server.app")[0]}
    assert "engine.engine" in closure("server.app")
    assert "torch" in imports("engine.engine")[1]


# Cycles known and waiting for their owner to break them, each a set of modules, with why.
# Empty: keep it so.
ALLOWED_CYCLES: list[set[str]] = []


def test_no_import_cycles():
    found = [set(c) for c in cycles({m: edges_in(source(m).read_text()) for m in MODULES})]
    assert [sorted(c) for c in found if c not in ALLOWED_CYCLES] == []


def test_the_cycle_rule_can_fail():
    """The checker finds a loop of three, a module importing itself, and not a chain; it reads
    a function's import as an edge and skips what only a type checker imports."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"d"}, "e": {"a"}, "f": set()}
    assert sorted(cycles(graph)) == [["a", "b", "c"], ["d"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    code = (
        "from typing import TYPE_CHECKING\n"
        "from batchproof.common import net\n"
        "if TYPE_CHECKING:\n"
        "    from batchproof.engine.engine import Engine\n"
        "else:\n"
        "    import batchproof.probe.wire.stream\n"
        "def f():\n"
        "    from batchproof.server.app import create_app\n"
    )
    assert edges_in(code) == {"common.net", "probe.wire.stream", "server.app"}


def run_blocking(blocked: tuple[str, ...], code: str) -> str:
    """Run `code` in a fresh interpreter where importing any of `blocked` fails -> its stdout."""
    block = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {blocked!r}:\n"
        "            raise ImportError(f'{name} is blocked in this test')\n"
        "sys.meta_path.insert(0, Block())\n"
    )
    result = subprocess.run([sys.executable, "-c", block + code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_probe_check_and_cli_run_without_torch_or_numpy():
    """At run time, with torch and numpy unimportable: the probe, the check and the CLI's
    parser (every verb's flags) load, and neither heavy module was even attempted."""
    assert run_blocking(("torch", "numpy"), (
        "import pkgutil, importlib, batchproof.probe, batchproof.check, batchproof.common, batchproof.report\n"
        "import batchproof.board, batchproof.cli\n"
        "for pkg in (batchproof.probe, batchproof.check, batchproof.common, batchproof.report, batchproof.board):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "batchproof.cli.build_parser()\n"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))\n"
    )) == "[]"


@pytest.mark.parametrize("module", [m for m in MODULES if layer(m) != "fleet"])
def test_only_the_fleet_imports_ray(module):
    assert "ray" not in imports(module)[1]


def test_the_single_server_runs_without_ray():
    """With ray unimportable, the server app, `batchproof serve` and the CLI's flags (the fleet's
    included: its settings are plain dataclasses) load, and ray was never attempted."""
    assert run_blocking(("ray",), (
        "import batchproof.server.app, batchproof.commands.serve, batchproof.fleet.config, batchproof.cli\n"
        "batchproof.cli.build_parser()\n"
        "print('ray' in sys.modules)\n"
    )) == "False"
