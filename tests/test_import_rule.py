"""The import rule: engine modules never import the server; the probe and the check never
import torch (nor numpy), not even through another module of ours."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "batchproof"
SERVER = {"app", "routes_chat", "routes_completions", "routes_admin", "protocol", "errors", "request_plan",
          "request_runner", "server_state", "server_info", "openai_format", "metrics", "batch_log",
          "openapi_schema", "serve_cmd"}
ENGINE = {"gguf_file", "default_model", "tokenizer", "chat_template", "model", "kv_cache", "kernels",
          "sampling_params", "sampler", "logprobs", "text_stream", "sequence", "scheduler", "model_runner",
          "engine", "async_engine", "config"}
TORCH_FREE_PREFIXES = ("probe", "check")
TORCH_FREE = {"contract", "witness_read", "cli", "cli_args", "config", "hashing"}


def our_imports(module: str) -> set[str]:
    """Every batchproof module named in an import statement of `module`, at any depth."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "batchproof":
                found |= {alias.name for alias in node.names}
            elif node.module.startswith("batchproof."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("batchproof.")}
    return found


def foreign_imports(module: str) -> set[str]:
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def closure(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        current = todo.pop()
        if current in seen or not (PACKAGE / f"{current}.py").exists():
            continue
        seen.add(current)
        todo.extend(our_imports(current))
    return seen


def torch_free_modules() -> list[str]:
    names = [p.stem for p in PACKAGE.glob("*.py")]
    return sorted(n for n in names if n.startswith(TORCH_FREE_PREFIXES) or n in TORCH_FREE)


@pytest.mark.parametrize("module", sorted(ENGINE))
def test_engine_modules_never_import_the_server(module):
    assert not closure(module) & SERVER


@pytest.mark.parametrize("module", torch_free_modules())
def test_probe_and_check_never_import_torch(module):
    heavy = {m: foreign_imports(m) & {"torch", "numpy"} for m in closure(module)}
    assert not any(heavy.values()), {m: sorted(v) for m, v in heavy.items() if v}


def test_rule_holds_at_run_time():
    code = ("import sys, batchproof.probe, batchproof.check, batchproof.cli; batchproof.cli.build_parser(); "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_every_module_is_classified():
    names = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    unclassified = names - SERVER - ENGINE - set(torch_free_modules()) - {
        "bench", "generate_cmd", "witness_cmd", "errors_cli"}
    assert not unclassified, f"add these to the import rule: {sorted(unclassified)}"
