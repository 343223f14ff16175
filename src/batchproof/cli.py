"""The `batchproof` command: one subcommand per job, each defined in its own module.

Command modules import nothing heavy at module level, so `batchproof probe` and
`batchproof check` start without torch.
"""

import argparse
import importlib
import sys

# name -> (module, one-line help). Each module has add_arguments(parser) and run(args) -> int.
COMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("batchproof.commands.generate", "generate one chat reply with logprobs"),
    "serve": ("batchproof.commands.serve", "serve the OpenAI-compatible API"),
    "fleet": ("batchproof.commands.fleet", "serve the same API from N engine replicas on Ray Serve"),
    "models": ("batchproof.commands.models", "list the models batchproof knows by name, and how to install each"),
    "bench": ("batchproof.commands.bench", "measure load, prefill and decode speed"),
    "probe": ("batchproof.commands.probe", "measure a server's batch parity and write a witness"),
    "check": ("batchproof.commands.check", "judge a witness against the serving-shape contract"),
    "witness": ("batchproof.commands.witness", "serve, probe and check in one command"),
    "report": ("batchproof.commands.report", "write a witness and its check as one HTML page"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="batchproof", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(module_name)
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(command_parser)
        command_parser.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
