"""`batchproof report WITNESS.json [-o report.html]`: the witness and its check as one HTML page."""

import argparse
import json
import sys
from pathlib import Path

from batchproof.check.contract import ContractError, load_contract
from batchproof.check.rules import judge
from batchproof.check.witness import WitnessError, parse_witness
from batchproof.common.printable import printable
from batchproof.report.page import render
from batchproof.report.shown_keys import check_shown_keys

EXIT_WRITTEN = 0
EXIT_NOT_A_FILE = 3
EXIT_UNREADABLE = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("witness", metavar="WITNESS.json", help="the witness `batchproof probe` wrote")
    parser.add_argument("-o", "--out", metavar="FILE", help="the HTML file to write (default: WITNESS with .html)")
    parser.add_argument("--contract", metavar="FILE", help="the contract to judge by (default: the shipped one)")


def _fail(message: str, code: int) -> int:
    print(printable(f"batchproof report: {message}"), file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    path = Path(args.witness)
    out = Path(args.out) if args.out else path.with_suffix(".html")
    contract_path = Path(args.contract) if args.contract else None
    for what, given in (("witness", path), ("--contract", contract_path)):
        if given is not None and not given.is_file():
            return _fail(f"{what} {given}: not a regular file", EXIT_NOT_A_FILE)
    if out.is_dir() or not out.absolute().parent.is_dir():
        return _fail(f"-o {out}: not a file in an existing directory", EXIT_NOT_A_FILE)
    try:
        text = path.read_bytes().decode("utf-8")
        typed = parse_witness(text)
        raw = json.loads(text)  # the page also shows keys the check does not judge
        check_shown_keys(raw)
        contract = load_contract(contract_path)
    except (OSError, UnicodeDecodeError) as err:
        return _fail(f"{path}: unreadable ({err})", EXIT_UNREADABLE)
    except WitnessError as err:
        return _fail(f"witness {path}: {err}", EXIT_UNREADABLE)
    except ContractError as err:
        return _fail(f"contract {contract_path}: {err}", EXIT_UNREADABLE)
    reasons = judge(typed, contract)
    verdict = "NOT ADMISSIBLE" if reasons else "ADMISSIBLE"
    page = render(raw, verdict, reasons, contract.decode_ratio_c4_over_c1, path.name)
    try:
        out.write_text(page, encoding="utf-8")
    except OSError as err:
        return _fail(f"cannot write {out}: {err.strerror}", EXIT_NOT_A_FILE)
    print(printable(f"report: {out} ({verdict}, {len(reasons)} reason(s))"))
    return EXIT_WRITTEN
