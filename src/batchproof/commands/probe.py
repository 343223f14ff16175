"""`batchproof probe`: measure a server's batch parity and write a witness (no torch)."""

import argparse
import asyncio
import sys

from batchproof.common.printable import printable
from batchproof.probe.config import add_config_arguments, config_from_args
from batchproof.probe.display import ProgressDisplay, report_lines
from batchproof.probe.matrix import MatrixError, load_matrix
from batchproof.probe.prompts import PromptsError
from batchproof.probe.run import Prober, fired_prompts
from batchproof.probe.witness import build_witness, identify, write_witness

EXIT_CODES = {"PASS": 0, "FAIL": 5, "UNMEASURABLE": 8}
EXIT_BAD_ARGUMENT = 2
EXIT_NOT_A_FILE = 3
EXIT_BAD_MATRIX = 4
EXIT_UNREACHABLE = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)


def _fail(message: str, code: int) -> int:
    print(printable(f"batchproof probe: {message}"), file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ValueError as err:
        return _fail(str(err), EXIT_BAD_ARGUMENT)
    problem = config.file_problem()
    if problem is not None:
        return _fail(problem, EXIT_NOT_A_FILE)
    try:
        matrix = load_matrix(config.matrix)
        if config.ladder is not None:
            matrix = matrix.with_ladder(list(config.ladder))
    except MatrixError as err:
        return _fail(str(err), EXIT_BAD_MATRIX)
    try:
        prompts = config.prompt_set()
    except PromptsError as err:
        return _fail(str(err), EXIT_BAD_ARGUMENT)
    prompts = fired_prompts(config, matrix, prompts)
    try:
        identity = identify(config)
    except OSError as err:
        return _fail(f"cannot read {err.filename}: {err.strerror}", EXIT_NOT_A_FILE)
    with ProgressDisplay() as progress:
        record = asyncio.run(Prober(config, matrix, progress, prompts).run())
    witness = build_witness(config, matrix, identity, record, prompts)
    if config.witness is not None:
        try:
            write_witness(config.witness, witness)
        except OSError as err:
            return _fail(f"cannot write the witness {config.witness}: {err.strerror}", EXIT_NOT_A_FILE)
    if record.unreachable is not None:
        written = f" (witness: {config.witness})" if config.witness is not None else ""
        return _fail(f"server unreachable: {record.unreachable}{written}", EXIT_UNREACHABLE)
    print("\n".join(report_lines(witness)))
    if config.witness is not None:
        print(f"witness: {config.witness}")
    return EXIT_CODES[record.result]
