"""`batchproof serve`: the OpenAI-compatible server on one engine."""

import argparse
import sys

from batchproof.commands.flags import add_dataclass_arguments, dataclass_from_args
from batchproof.common.config import ConfigError
from batchproof.engine.config import EngineConfig
from batchproof.server.config import ServerConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_arguments(parser.add_argument_group("server"), ServerConfig)
    add_dataclass_arguments(parser.add_argument_group("engine"), EngineConfig)


def run(args: argparse.Namespace) -> int:
    try:
        server_config = dataclass_from_args(ServerConfig, args)
        engine_config = dataclass_from_args(EngineConfig, args)
    except ConfigError as e:
        print(f"batchproof serve: {e}", file=sys.stderr)
        return 2
    if engine_config.model_path is not None and not engine_config.model_path.is_file():
        print(f"batchproof serve: {engine_config.model_path}: no such file", file=sys.stderr)
        return 2

    import uvicorn

    from batchproof.server.app import create_app

    app = create_app(server_config, engine_config)
    print(f"batchproof: serving on http://{server_config.host}:{server_config.port} (model loading; GET /health)",
          file=sys.stderr)
    uvicorn.run(app, host=server_config.host, port=server_config.port, log_level="warning", access_log=False)
    state = app.state.server
    if state.load_error is not None:
        print(f"batchproof serve: {state.load_error}", file=sys.stderr)
        return 2
    return 0
