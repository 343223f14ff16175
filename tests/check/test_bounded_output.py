"""What `batchproof check` prints stays short and inert: a huge value is cut, a YAML alias bomb
is refused at once, and a witness's strings cannot drive the terminal (exit codes unchanged)."""

import json
import resource
import subprocess
import sys
import time

import pytest

from batchproof.check.contract import shipped_contract_text
from tests.helpers.check_support import C4, check_text, control, run_cli

MAX_LINE = 300  # what a refusal may take: the path, the key, a value cut to ~40 characters

# "Billion laughs": nine levels of nine aliases, 9**9 strings in a few hundred bytes. Loading
# shares the objects; quoting the value in a message (or walking it) spells out all of them.
BOMB_BANDS = ("[&a [x, x, x, x, x, x, x, x, x], "
              + ", ".join(f"&{new} [{', '.join([f'*{old}'] * 9)}]" for old, new in zip("abcdefgh", "bcdefghi"))
              + "]")


def _contract(tmp_path, **replace: str):
    """The shipped contract with some keys' YAML replaced, as a file."""
    lines = [line for line in shipped_contract_text().splitlines() if line.split(":")[0] not in replace]
    path = tmp_path / "contract.yaml"
    path.write_text("\n".join(lines + [f"{key}: {value}" for key, value in replace.items()]) + "\n")
    return path


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a regression fails, not the machine


def test_a_yaml_alias_bomb_in_a_contract_is_refused_at_once_in_one_line(tmp_path) -> None:
    contract = _contract(tmp_path, bands=BOMB_BANDS)
    witness = tmp_path / "witness.json"
    witness.write_text(json.dumps(control()))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "batchproof", "check", str(witness), "--contract", str(contract)],
                          capture_output=True, text=True, timeout=60, preexec_fn=_limit_memory)
    assert time.monotonic() - started < 30
    assert (done.returncode, done.stdout) == (4, "")
    assert done.stderr.count("\n") == 1 and len(done.stderr) < MAX_LINE, done.stderr[:MAX_LINE]
    assert "uses a YAML alias on line" in done.stderr


@pytest.mark.parametrize("replace", [
    {"near_tie_eps": json.dumps("9" * 10_000)},  # a string where a number is due
    {"bands": str([*range(1, 2_000), 0])},  # one band out of two thousand is wrong
    {"x" * 1_000: "1"},  # an unknown key (PyYAML's own limit on a key is 1,024 characters)
], ids=["value", "list", "key"])
def test_a_huge_contract_value_is_cut_in_the_message(tmp_path, replace: dict[str, str]) -> None:
    contract = _contract(tmp_path, **replace)
    code, out, err = check_text(tmp_path, "{}", "--contract", str(contract))
    assert (code, out) == (4, "") and err.count("\n") == 1 and len(err) < MAX_LINE, err[:MAX_LINE]


def test_yaml_that_does_not_parse_is_named_by_line_in_one_line(tmp_path) -> None:
    contract = tmp_path / "contract.yaml"
    contract.write_text("bands: [1, 4\nnear_tie_eps: 0.05\n")
    code, _, err = check_text(tmp_path, "{}", "--contract", str(contract))
    assert code == 4 and err.count("\n") == 1 and "is not YAML (line " in err


def test_a_huge_witness_key_is_cut_in_the_message(tmp_path) -> None:
    witness = control()
    witness["bands"][C4]["m_formed_by_replica"] = {"r" * 100_000: "four"}
    code, out, err = check_text(tmp_path, json.dumps(witness))
    assert (code, out) == (4, "") and err.count("\n") == 1 and len(err) < MAX_LINE, err[:MAX_LINE]


def test_a_witness_cannot_drive_the_terminal_through_the_reasons(tmp_path) -> None:
    witness = control()
    witness["bands"][C4]["result"] = "FAIL\x1b[2K\r  - all clear\x1b]0;owned\x07"  # erase, forge a line, retitle
    path = tmp_path / "witness.json"
    path.write_text(json.dumps(witness))
    code, out, _ = run_cli(["check", str(path)])
    assert code == 5
    assert not any(c in out for c in "\x1b\r\x07")
    assert "S6: c=4 result FAIL\\x1b[2K\\x0d  - all clear\\x1b]0;owned\\x07 is not PASS" in out
