"""`batchproof board BOARD.yaml --out DIR`: probe every server of a board file, with negative
controls, and write DIR/board.json and DIR/board.html (no torch)."""

import argparse
import json
import sys
from pathlib import Path

from batchproof.board.page import render
from batchproof.board.run import run_board
from batchproof.board.spec import BoardError, load_board
from batchproof.check.contract import ContractError, load_contract
from batchproof.common.printable import printable
from batchproof.probe.matrix import MatrixError, load_matrix

EXIT_VALID = 0
EXIT_BAD_BOARD = 2
EXIT_NOT_A_FILE = 3
EXIT_INVALID = 5  # the board ran, but a negative control was not caught: no verdict on it holds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("board", metavar="BOARD.yaml", type=Path, help="the servers and configurations to probe")
    parser.add_argument("--out", metavar="DIR", type=Path, required=True,
                        help="where board.json, board.html and every run's witness and report go")
    parser.add_argument("--resume", action="store_true",
                        help="keep the witnesses an interrupted board (the same file) left in --out: each run "
                             "that has one is checked again, not probed; a server with all its runs there is "
                             "not started")


def _fail(message: str, code: int) -> int:
    print(printable(f"batchproof board: {message}"), file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    if not args.board.is_file():
        return _fail(f"{args.board}: not a regular file", EXIT_NOT_A_FILE)
    if args.out.exists() and not args.out.is_dir():
        return _fail(f"--out {args.out}: not a directory", EXIT_NOT_A_FILE)
    try:
        spec = load_board(args.board)
        matrix = load_matrix(spec.matrix)
        contract = load_contract(spec.contract)
    except (BoardError, MatrixError) as error:
        return _fail(f"{args.board}: {error}", EXIT_BAD_BOARD)
    except ContractError as error:
        return _fail(f"{args.board}: contract {spec.contract}: {error}", EXIT_BAD_BOARD)
    except OSError as error:
        return _fail(f"{args.board}: cannot read {error.filename}: {error.strerror}", EXIT_NOT_A_FILE)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return _fail(f"--out {args.out}: cannot create it ({error.strerror})", EXIT_NOT_A_FILE)
    board = run_board(spec, matrix, contract, args.out, resume=args.resume)
    (args.out / "board.json").write_text(json.dumps(board, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    (args.out / "board.html").write_text(render(board), encoding="utf-8")
    for row in board["rows"]:
        control = " (control)" if row["control"] else ""
        why = f": {row['why']}" if row["why"] else ""
        print(printable(f"{row['server']}{control} · {row['configuration']}: {row['verdict']}{why}"))
    print(f"board {'VALID' if board['valid'] else 'INVALID'}: {args.out / 'board.html'}")
    for line in board["invalid_because"]:
        print(printable(f"  - {line}"))
    return EXIT_VALID if board["valid"] else EXIT_INVALID
