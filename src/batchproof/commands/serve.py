"""`batchproof serve`: the OpenAI-compatible server on one engine."""

import argparse
import dataclasses
import sys
import threading

from batchproof.commands.flags import add_dataclass_arguments, dataclass_from_args
from batchproof.common.config import ConfigError
from batchproof.engine.config import EngineConfig
from batchproof.server.config import ServerConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_arguments(parser.add_argument_group("server"), ServerConfig)
    add_dataclass_arguments(parser.add_argument_group("engine"), EngineConfig)


def configs(args: argparse.Namespace, command: str) -> tuple[ServerConfig, EngineConfig] | None:
    """The server's and the engine's settings, with the model checked to exist (a name or a
    missing file fails here, before anything starts); None after saying why on stderr."""
    from batchproof.server.guards.auth import server_api_keys

    try:
        server_config = dataclass_from_args(ServerConfig, args)
        engine_config = dataclass_from_args(EngineConfig, args)
        server_api_keys(server_config)  # a missing key file, or weight updates without a key, fail here
    except ConfigError as e:
        print(f"batchproof {command}: {e}", file=sys.stderr)
        return None
    from batchproof.engine.model.errors import load_error_message
    from batchproof.engine.model.known_models import resolve_model

    try:
        model_path = resolve_model(engine_config.model_path)
    except Exception as e:
        if (message := load_error_message(e)) is None:
            raise
        print(f"batchproof {command}: {message}", file=sys.stderr)
        return None
    if not model_path.is_file() and not model_path.is_dir():  # a directory: a Hugging Face checkpoint
        print(f"batchproof {command}: {model_path}: no such file or directory", file=sys.stderr)
        return None
    return server_config, engine_config


def run_app(app, server_config: ServerConfig, command: str) -> int:
    """Serve `app` until interrupted; a model that cannot load ends it, as llama-server and vLLM
    end: the reason on stderr and a non-zero exit, not a server that answers 503 to a user who
    sees nothing. So does an engine that stops for good (faults in a row), so that a supervisor
    restarts the process."""
    import uvicorn

    from batchproof.server.guards.connections import raise_open_files_limit, uvicorn_config

    raise_open_files_limit()
    server = uvicorn.Server(uvicorn_config(app, server_config.host, server_config.port))
    state = app.state.server
    state.on_load_error = lambda: setattr(server, "should_exit", True)
    engine_stopped = threading.Event()

    def on_engine_failure() -> None:  # on the engine thread: uvicorn polls should_exit
        engine_stopped.set()
        server.should_exit = True

    state.on_engine_failure = on_engine_failure
    print(f"batchproof: serving on http://{server_config.host}:{server_config.port} (model loading; GET /health)",
          file=sys.stderr)
    server.run()
    if state.load_error is not None:
        print(f"batchproof {command}: {state.load_error}", file=sys.stderr)
        return 2
    if engine_stopped.is_set():
        failure = state.backend.failure
        print(f"batchproof {command}: the engine stopped ({type(failure).__name__}: {failure}); exiting so that "
              "a supervisor restarts it", file=sys.stderr)
        return 1
    return 0


def run(args: argparse.Namespace) -> int:
    settings = configs(args, "serve")
    if settings is None:
        return 2
    server_config, engine_config = settings
    from batchproof.engine.model.known_models import resolve_model
    from batchproof.server.app import create_app

    engine_config = dataclasses.replace(engine_config, model_path=resolve_model(engine_config.model_path))
    return run_app(create_app(server_config, engine_config), server_config, "serve")
