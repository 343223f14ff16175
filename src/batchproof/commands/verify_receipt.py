"""`batchproof verify-receipt FILE [--model PATH | --url URL]`: re-execute receipts (docs/receipts.md)
on an engine loaded here or on a running server, and say for each MATCH, or which input differs
and the first output position where the re-executed reply does. The exit code names the verdict
(the first receipt's that does not match, for a file of many): 0 MATCH, 2 a bad receipt or
file, 3 weights, 4 numerics, 5 tokenizer, 6 template, 7 params, 8 prompt, 9 a token, 10 a
logprob's bits, 11 not re-executable here."""

import argparse
import os
import sys
from pathlib import Path

from batchproof.common.config import ConfigError

PROG = "batchproof verify-receipt"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from batchproof.commands.flags import add_dataclass_arguments
    from batchproof.engine.config import EngineConfig

    parser.add_argument("file", type=Path, help="a receipt, a reply carrying receipts (chat, completions or "
                                                "Responses), a JSON list of these, or JSONL, one a line")
    parser.add_argument("--url", help="re-execute on this running batchproof server (its /v1/completions) "
                                      "instead of an engine loaded here")
    parser.add_argument("--api-key", help="the server's key, for --url (or set $BATCHPROOF_API_KEY)")
    parser.add_argument("--out", type=Path, help="also write verdicts.json and report.html in this directory")
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON lines")
    add_dataclass_arguments(parser.add_argument_group("engine (in process: the settings the receipts' server "
                                                      "ran with, e.g. --model, --chat-template, --weights)"),
                            EngineConfig)


def _host(args: argparse.Namespace, engine):
    """Where to re-execute, or None after saying why on stderr."""
    from batchproof.commands.flags import dataclass_from_args
    from batchproof.commands.receipts.local import LocalHost
    from batchproof.commands.receipts.remote import RemoteHost
    from batchproof.engine.config import EngineConfig
    from batchproof.engine.engine import Engine
    from batchproof.engine.model.errors import load_error_message

    if args.url is not None:
        if args.model_path is not None:
            print(f"{PROG}: --model or --url, not both", file=sys.stderr)
            return None
        return RemoteHost(args.url, args.api_key or os.environ.get("BATCHPROOF_API_KEY"))
    if engine is not None:
        return LocalHost(engine)
    try:
        return LocalHost(Engine(dataclass_from_args(EngineConfig, args)))
    except ConfigError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
    except Exception as e:
        message = load_error_message(e)
        if message is None:
            raise
        print(f"{PROG}: {message}", file=sys.stderr)
    return None


def run(args: argparse.Namespace, engine=None) -> int:
    """`engine`: one already loaded (tests), else loaded from the engine flags (or --url)."""
    from batchproof.commands.receipts.reexecute import verify
    from batchproof.commands.receipts.remote import RemoteError
    from batchproof.common.wire import dumps
    from batchproof.notary.receipts.page import render, summary
    from batchproof.notary.receipts.read import read_items

    if not args.file.is_file():
        print(f"{PROG}: no file {args.file}", file=sys.stderr)
        return 2
    items = read_items(args.file)
    if not items:
        print(f"{PROG}: no receipt in {args.file}", file=sys.stderr)
        return 2
    host = _host(args, engine)
    if host is None:
        return 2
    try:
        verdicts = [{"where": item.where, **v.as_json()} for item, v in zip(items, verify(items, host))]
    except RemoteError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    for v in verdicts:
        if args.json:
            print(dumps(v))
        else:
            where = "" if v["field"] is None else f" {v['field']}"
            at = "" if v["position"] is None else f" at output position {v['position']}"
            print(f"{v['where']}: {v['verdict']}{where}{at}: {v['message']}")
    totals = summary(verdicts)
    if len(verdicts) > 1 and not args.json:
        print(f"{totals['num_receipts']} receipts: " + ", ".join(f"{n} {kind}" for kind, n in
                                                                 sorted(totals["verdicts"].items())))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "verdicts.json").write_text(dumps({"summary": totals, "verdicts": verdicts}) + "\n",
                                                encoding="utf-8")
        (args.out / "report.html").write_text(render(verdicts, f"Receipts: {args.file.name}"), encoding="utf-8")
    return totals["exit_code"]
