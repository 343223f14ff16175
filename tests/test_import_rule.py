"""The import rule, derived from the tree: a module's layer is the package it lives in.

    common  <- engine <- server <- commands (and cli)
               engine, server <- fleet <- commands
    common  <- probe
    common  <- check
    common, check <- report

`common`, `probe`, `check` and `report` import neither torch nor numpy, not even through another
module of ours; the engine never imports the server; the probe and the check never
import each other; only the fleet imports ray (an optional extra), so the single server
never needs it. A new module is covered by where it is put.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "batchproof"

# layer -> the layers of ours it may import (itself included)
ALLOWED = {
    "common": {"common"},
    "engine": {"common", "engine"},
    "server": {"common", "engine", "server"},
    "fleet": {"common", "engine", "server", "fleet"},
    "probe": {"common", "probe"},
    "check": {"common", "check"},
    "report": {"common", "check", "report"},
    "commands": {"common", "engine", "server", "fleet", "probe", "check", "report", "commands"},
    "cli": {"commands"},
}
TORCH_FREE = {"common", "probe", "check", "report"}
HEAVY = {"torch", "numpy"}


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


def test_the_rule_can_fail():
    """The checker sees a forbidden edge: the server imports the engine, not the reverse."""
    assert "engine" in {layer(m) for m in imports("server.app")[0]}
    assert "engine.engine" in closure("server.app")
    assert "torch" in imports("engine.engine")[1]


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
        "import batchproof.cli\n"
        "for pkg in (batchproof.probe, batchproof.check, batchproof.common, batchproof.report):\n"
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
