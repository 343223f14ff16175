"""The `batchproof` command: one subcommand per job, each defined in its own module.

Command modules import nothing heavy at module level, and only the chosen verb's module is
loaded, so `batchproof probe` and `batchproof check` start without torch or the engine, on the
light install (`pip install batchproof`) as well as the full one.
"""

import argparse
import importlib
import sys
from collections.abc import Iterable
from typing import NamedTuple

from batchproof.commands.extras import install_hint, missing


class Verb(NamedTuple):
    module: str  # has add_arguments(parser) and run(args) -> int
    help: str
    extra: str | None = None  # the extra its run needs beyond the light install


SERVE = "serve"
COMMANDS: dict[str, Verb] = {
    "generate": Verb("batchproof.commands.generate", "generate one chat reply with logprobs", SERVE),
    "serve": Verb("batchproof.commands.serve", "serve the OpenAI-compatible API", SERVE),
    "fleet": Verb("batchproof.commands.fleet", "serve the same API from N engine replicas on Ray Serve", "fleet"),
    "models": Verb("batchproof.commands.models", "list the models batchproof knows by name, and how to install each"),
    "bench": Verb("batchproof.commands.bench", "measure load, prefill and decode speed", SERVE),
    "probe": Verb("batchproof.commands.probe", "measure a server's batch parity and write a witness"),
    "check": Verb("batchproof.commands.check", "judge a witness against the serving-shape contract"),
    "witness": Verb("batchproof.commands.witness", "serve, probe and check in one command", SERVE),
    "report": Verb("batchproof.commands.report", "write a witness and its check as one HTML page"),
    "board": Verb("batchproof.commands.board", "probe every server of a board file twice, with negative controls"),
    "verify-rollouts": Verb("batchproof.commands.verify_rollouts",
                            "re-score another engine's rollouts and report the logprob gap", SERVE),
    "verify-receipt": Verb("batchproof.commands.verify_receipt",
                           "re-execute reply receipts here or on a server: MATCH, or what differs", SERVE),
}


def build_parser(verbs: Iterable[str] = COMMANDS) -> argparse.ArgumentParser:
    """Every verb listed by name; the flags of `verbs` only (all of them unless told), each
    verb's module imported only to add its flags."""
    verbs = set(verbs)
    parser = argparse.ArgumentParser(prog="batchproof", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, verb in COMMANDS.items():
        command_parser = sub.add_parser(name, help=verb.help, description=verb.help)
        if name in verbs:
            module = importlib.import_module(verb.module)
            module.add_arguments(command_parser)
            command_parser.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # The verb comes first (the top level has no flags of its own but --help).
    args = build_parser(argv[:1] if argv[:1] and argv[0] in COMMANDS else ()).parse_args(argv)
    extra = COMMANDS[args.command].extra
    if extra is not None and (absent := missing(extra)):
        print(install_hint(args.command, extra, absent), file=sys.stderr)
        return 2
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
