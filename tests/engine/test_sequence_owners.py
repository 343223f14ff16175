"""One writer per `Sequence` field. A field that several modules assign makes a promise hard to
keep: the prefix cache's (never a key written under old weights or by a failed step) lived in
five. Each field has one owner, the only module that assigns it; others ask the owner (the
runner's `accept`, `discard`, `restart`; the cache manager's `take_reused`, `drop_reused`).

Two routes to the same answer: every assignment in the source to a sequence's field (read from
the AST), and every assignment that actually happens while an engine runs each path that
touches them (prefix-cache reuse, speculation, a keep swap mid-prefill and mid-reply, an abort,
a failed step), caught at `Sequence.__setattr__` with the assigning module's name."""

import ast
import sys
from pathlib import Path

import pytest

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.ops import kernels
from batchproof.engine.sampling.params import SamplingParams
from batchproof.engine.sequence import Sequence

SRC = Path(__file__).resolve().parents[2] / "src"
SEQUENCE = SRC / "batchproof" / "engine" / "sequence.py"

# field -> its one writer (besides sequence.py itself: the constructor and append()). Fields set
# only when the sequence is built are sequence.py's: the engine passes them to the constructor.
OWNERS = {
    "status": "batchproof.engine.scheduler",  # waiting -> running -> retired
    "is_aborted": "batchproof.engine.engine",
    # how it ended, and what it chose
    "finish_reason": "batchproof.engine.outputs",
    "error": "batchproof.engine.outputs",
    "error_code": "batchproof.engine.outputs",
    # what its slot holds: fed by the runner alone
    "num_computed": "batchproof.engine.runner",
    "prefill": "batchproof.engine.runner",
    "is_refilling": "batchproof.engine.runner",
    # the slot and what the prefix cache gave it: the cache manager's
    "slot": "batchproof.engine.cache.manager",
    "reused": "batchproof.engine.cache.manager",
    "num_cached_tokens": "batchproof.engine.cache.manager",
    # which weights chose its tokens: the version marks
    "weight_versions": "batchproof.engine.weight_versions",
    "num_released": "batchproof.engine.weight_versions",
}
OWN = "batchproof.engine.sequence"
# The names a sequence goes by in our source (the runtime route below catches any other).
SEQUENCE_NAMES = {"seq", "sequence", "s", "feeding"}


def sequence_fields() -> set[str]:
    tree = ast.parse(SEQUENCE.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Sequence")
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


FIELDS = sequence_fields()


def assigned_fields(code: str) -> list[tuple[str, int]]:
    """(field, line) for each assignment to a sequence's field: `seq.x = `, `seq.x += `, a
    tuple target, `span.seq.x = `, setattr(seq, "x", ...)."""
    found = []

    def receiver_is_a_sequence(node: ast.expr) -> bool:
        return ((isinstance(node, ast.Name) and node.id in SEQUENCE_NAMES)
                or (isinstance(node, ast.Attribute) and node.attr in SEQUENCE_NAMES))

    for node in ast.walk(ast.parse(code)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and len(node.args) >= 2 and receiver_is_a_sequence(node.args[0])
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in FIELDS):
            found.append((node.args[1].value, node.lineno))
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, ast.Attribute) and t.attr in FIELDS and receiver_is_a_sequence(t.value):
                    found.append((t.attr, node.lineno))
    return found


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def wrong_writers(writes: dict[str, set[str]]) -> dict[str, set[str]]:
    """field -> the modules that assign it but may not."""
    wrong = {}
    for field, modules in writes.items():
        allowed = {OWN, OWNERS[field]} if field in OWNERS else {OWN}
        if modules - allowed:
            wrong[field] = modules - allowed
    return wrong


def test_every_owned_name_is_a_field():
    assert set(OWNERS) <= FIELDS and {"num_computed", "reused", "slot", "status"} <= FIELDS


def test_in_the_source_each_field_has_one_writer():
    writes: dict[str, set[str]] = {}
    where: dict[tuple[str, str], list[int]] = {}
    for path in (SRC / "batchproof").rglob("*.py"):
        if path == SEQUENCE:
            continue
        for field, line in assigned_fields(path.read_text()):
            writes.setdefault(field, set()).add(module_name(path))
            where.setdefault((field, module_name(path)), []).append(line)
    wrong = wrong_writers(writes)
    assert not wrong, "; ".join(f"{field} (owner {OWNERS.get(field, OWN)}) assigned in "
                                + ", ".join(f"{m}:{where[field, m]}" for m in sorted(mods))
                                for field, mods in sorted(wrong.items()))


def test_the_source_route_can_fail():
    code = ("seq.num_computed = 0\n"
            "span.seq.prefill, x = None, 1\n"
            "s.num_computed += 2\n"
            "setattr(seq, 'reused', None)\n"
            "out.finish_reason = 'stop'\n")  # a RequestOutput's, not a sequence's
    assert assigned_fields(code) == [("num_computed", 1), ("prefill", 2), ("num_computed", 3), ("reused", 4)]
    assert wrong_writers({"num_computed": {"batchproof.engine.outputs", "batchproof.engine.runner"}}) == {
        "num_computed": {"batchproof.engine.outputs"}}


@pytest.mark.skipif(not kernels.available(), reason="speculation and the prefix cache need our kernels")
def test_while_an_engine_runs_each_field_has_one_writer(tiny_pair, monkeypatch):
    """Every path that writes the prefill, cache and version fields, run for real."""
    writes: dict[str, set[str]] = {}
    plain_setattr = object.__setattr__

    def recording(self, name, value):
        writes.setdefault(name, set()).add(sys._getframe(1).f_globals["__name__"])
        plain_setattr(self, name, value)

    monkeypatch.setattr(Sequence, "__setattr__", recording)
    old_path, new_path = tiny_pair
    engine = Engine(EngineConfig(model_path=old_path, device="cpu", max_batch=4, num_threads=1,
                                 max_prefill_tokens=8, speculative=True))
    prompt = engine.tokenizer.encode("hello the world and then the world hello " * 3, add_bos=False)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, top_logprobs=2, prompt_logprobs=1)
    engine.generate({"warm": (prompt, params)})  # stored in the prefix cache
    engine.generate({"hit": (prompt + prompt[:5], params)})  # served from it
    # A keep swap with one sequence mid-prefill and one mid-reply, then an abort.
    engine.add_request("mid-reply", prompt, params)
    while not engine.scheduler.running or engine.scheduler.running[0].is_prefilling:
        engine.step()
    engine.step()
    engine.add_request("mid-prefill", prompt[::-1], params)
    engine.step()
    engine.install_weights(engine.prepare_weights(new_path), keep=True)
    engine.abort("mid-prefill")
    while engine.has_work():
        engine.step()
    # A step that raised: its sequences are discarded and end with an error.
    engine.add_request("failed", prompt, params)
    engine.step()
    engine.fail_step("boom")
    while engine.has_work():
        engine.step()
    assert {"num_computed", "prefill", "is_refilling", "reused", "slot", "status"} <= set(writes)
    assert "batchproof.engine.runner" in writes["is_refilling"]  # the refill really ran
    wrong = wrong_writers({field: modules for field, modules in writes.items() if field in FIELDS})
    assert not wrong, wrong
