"""`batchproof serve`: the OpenAI-compatible server on one engine."""

import argparse
import dataclasses
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
    from batchproof.engine.load_errors import load_error_message
    from batchproof.engine.model.known_models import resolve_model

    try:  # a name or a missing file fails here, before the server starts
        model_path = resolve_model(engine_config.model_path)
    except Exception as e:
        if (message := load_error_message(e)) is None:
            raise
        print(f"batchproof serve: {message}", file=sys.stderr)
        return 2
    if not model_path.is_file():
        print(f"batchproof serve: {model_path}: no such file", file=sys.stderr)
        return 2
    engine_config = dataclasses.replace(engine_config, model_path=model_path)

    import uvicorn

    from batchproof.server.app import create_app

    app = create_app(server_config, engine_config)
    server = uvicorn.Server(uvicorn.Config(app, host=server_config.host, port=server_config.port,
                                           log_level="warning", access_log=False))
    state = app.state.server
    # A model that cannot load ends the server, as llama-server and vLLM end: the reason on
    # stderr and a non-zero exit, not a server that answers 503 to a user who sees nothing.
    state.on_load_error = lambda: setattr(server, "should_exit", True)
    print(f"batchproof: serving on http://{server_config.host}:{server_config.port} (model loading; GET /health)",
          file=sys.stderr)
    server.run()
    if state.load_error is not None:
        print(f"batchproof serve: {state.load_error}", file=sys.stderr)
        return 2
    return 0
