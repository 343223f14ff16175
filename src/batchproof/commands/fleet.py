"""`batchproof fleet`: N engine replicas on Ray Serve behind one OpenAI endpoint; the same
routes, flags and answers as `batchproof serve`."""

import argparse
import sys

from batchproof.commands.flags import add_dataclass_arguments, dataclass_from_args
from batchproof.commands.serve import add_arguments as add_serve_arguments
from batchproof.commands.serve import configs, run_app
from batchproof.common.config import ConfigError
from batchproof.fleet.config import FleetConfig

NO_RAY = "Ray Serve is not installed: pip install -e '.[fleet]' (or pip install 'ray[serve]')"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_arguments(parser.add_argument_group("fleet"), FleetConfig)
    add_serve_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        fleet_config = dataclass_from_args(FleetConfig, args)
    except ConfigError as e:
        print(f"batchproof fleet: {e}", file=sys.stderr)
        return 2
    settings = configs(args, "fleet")
    if settings is None:
        return 2
    try:
        from batchproof.fleet.launch import fleet_app, shutdown
    except ImportError as e:
        if e.name is None or not e.name.startswith("ray"):
            raise
        print(f"batchproof fleet: {NO_RAY}", file=sys.stderr)
        return 2
    server_config, engine_config = settings
    app, _ = fleet_app(fleet_config, server_config, engine_config)
    try:
        return run_app(app, server_config, "fleet")
    finally:
        shutdown()
