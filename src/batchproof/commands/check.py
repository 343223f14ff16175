"""`batchproof check WITNESS.json`: judge a witness against the serving-shape parity contract."""

# This module reads files and prints; the rules live in check_rules, the reading in
# witness_read and contract. Stdlib and PyYAML only: no torch, no numpy.

import argparse
import json
import sys
from pathlib import Path

from batchproof.check.contract import Contract, ContractError, load_contract
from batchproof.check.rules import judge
from batchproof.check.witness import WitnessError, parse_witness
from batchproof.common.printable import printable

EXIT_ADMISSIBLE = 0
EXIT_NOT_A_FILE = 3
EXIT_UNREADABLE = 4
EXIT_NOT_ADMISSIBLE = 5


class CheckInputError(Exception):
    """A witness or contract that cannot be judged, with the exit code it earns."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("witness", metavar="WITNESS.json", help="the witness `batchproof probe` wrote")
    parser.add_argument(
        "--contract",
        metavar="FILE",
        help="a contract YAML to judge by (default: the shipped serving-shape-parity.yaml)",
    )
    parser.add_argument("--json", action="store_true", help='print {"verdict": ..., "reasons": [...]}')


def _require_file(path: Path, what: str) -> None:
    if not path.is_file():
        raise CheckInputError(f"{what} {path}: not a regular file", EXIT_NOT_A_FILE)


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except OSError as error:
        raise CheckInputError(f"{what} {path}: unreadable ({error.strerror})", EXIT_UNREADABLE) from None
    except UnicodeDecodeError as error:
        raise CheckInputError(f"{what} {path}: not UTF-8 text ({error.reason})", EXIT_UNREADABLE) from None


def _load(witness_path: Path, contract_path: Path | None) -> tuple[dict, Contract]:
    """Both inputs, typed; every path is checked before any file is read."""
    _require_file(witness_path, "witness")
    if contract_path is not None:
        _require_file(contract_path, "contract")
    contract_name = contract_path or "shipped"
    try:
        contract = load_contract(contract_path)
    except ContractError as error:
        raise CheckInputError(f"contract {contract_name}: {error}", EXIT_UNREADABLE) from None
    except (OSError, UnicodeDecodeError) as error:
        raise CheckInputError(f"contract {contract_name}: unreadable ({error})", EXIT_UNREADABLE) from None
    try:
        witness = parse_witness(_read_text(witness_path, "witness"))
    except WitnessError as error:
        raise CheckInputError(f"witness {witness_path}: {error}", EXIT_UNREADABLE) from None
    return witness, contract


def _print_verdict(path: Path, verdict: str, reasons: list[str], as_json: bool) -> None:
    if as_json:
        print(json.dumps({"verdict": verdict, "reasons": reasons}))
        return
    # A reason quotes the witness's strings (a replica id, a model path, a fleet's reason).
    print(printable(f"shape check {path}: {verdict}"))
    for reason in reasons:
        print(printable(f"  - {reason}"))


def run(args: argparse.Namespace) -> int:
    witness_path = Path(args.witness)
    contract_path = None if args.contract is None else Path(args.contract)
    try:
        witness, contract = _load(witness_path, contract_path)
    except CheckInputError as error:
        print(printable(f"shape check: {error}"), file=sys.stderr)
        if args.json:
            # A machine reader still gets one JSON line; RED is neither verdict.
            print(json.dumps({"verdict": "RED", "reasons": [str(error)]}))
        return error.exit_code
    reasons = judge(witness, contract)
    verdict = "NOT ADMISSIBLE" if reasons else "ADMISSIBLE"
    _print_verdict(witness_path, verdict, reasons, args.json)
    return EXIT_NOT_ADMISSIBLE if reasons else EXIT_ADMISSIBLE
