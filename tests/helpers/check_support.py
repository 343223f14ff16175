"""Shared helpers for the shape-check tests: the control witness and a CLI runner."""

import contextlib
import copy
import io
import json
from collections.abc import Callable
from pathlib import Path

from batchproof.cli import main

FIXTURES = Path(__file__).parent.parent / "check" / "fixtures"
APRENDER_CONTRACT = FIXTURES / "aprender-contract.yaml"
# The control's bands, by index: 0 is c=1, 1 is c=4, 2 is c=8, 3 is c=16.
C1, C4, C8, C16 = 0, 1, 2, 3
Mutation = Callable[[dict], None]


def control() -> dict:
    """A fresh copy of the admissible control witness."""
    return json.loads((FIXTURES / "control.json").read_text(encoding="utf-8"))


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`batchproof ARGV` in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def check_text(directory: Path, text: str | bytes, *options: str) -> tuple[int, str, str]:
    """Write `text` as a witness file and run `batchproof check` on it."""
    path = directory / "witness.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return run_cli(["check", str(path), *options])


def check_witness(directory: Path, witness: object, *options: str) -> tuple[int, list[str]]:
    """Run `batchproof check --json` on `witness`: (exit code, reasons)."""
    code, out, _ = check_text(directory, json.dumps(witness), "--json", *options)
    return code, json.loads(out)["reasons"]


def mutated(*mutations: Mutation) -> dict:
    witness = control()
    for mutation in mutations:
        mutation(witness)
    return witness


def set_band(index: int, key: str, value: object) -> Mutation:
    def mutate(witness: dict) -> None:
        witness["bands"][index][key] = value

    return mutate


def del_band_key(index: int, key: str) -> Mutation:
    def mutate(witness: dict) -> None:
        del witness["bands"][index][key]

    return mutate


def drop_band(index: int) -> Mutation:
    def mutate(witness: dict) -> None:
        del witness["bands"][index]

    return mutate


def set_top(key: str, value: object) -> Mutation:
    def mutate(witness: dict) -> None:
        witness[key] = value

    return mutate


def del_top(key: str) -> Mutation:
    def mutate(witness: dict) -> None:
        del witness[key]

    return mutate


def diverge(index: int, at: int, margin: object = "absent") -> Mutation:
    """Band `index` parts from m=1 at `at`, with `margin` recorded unless "absent"."""

    def mutate(witness: dict) -> None:
        witness["bands"][index]["divergence_at"] = at
        if margin != "absent":
            witness["bands"][index]["top2_margin_at_divergence"] = margin

    return mutate


def duplicate_band(index: int, **changes: object) -> Mutation:
    """Insert a changed copy of band `index` just before it."""

    def mutate(witness: dict) -> None:
        extra = copy.deepcopy(witness["bands"][index])
        extra.update(changes)
        witness["bands"].insert(index, extra)

    return mutate


def append_band(index: int, **changes: object) -> Mutation:
    """Append a changed copy of band `index` at the end."""

    def mutate(witness: dict) -> None:
        extra = copy.deepcopy(witness["bands"][index])
        extra.update(changes)
        witness["bands"].append(extra)

    return mutate
