"""The ASGI app: routes, errors, metrics, and the engine loaded in the background."""

import asyncio
import contextlib
import os
import sys
import threading
import traceback
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from batchproof.engine.async_engine import AsyncEngine
from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.errors import load_error_message
from batchproof.server import admin
from batchproof.server.batch_log import BatchLog
from batchproof.server.chat import route as chat_route
from batchproof.server.completions import route as completions_route
from batchproof.server.config import ServerConfig
from batchproof.server.engine_client import Backend, WeightControl
from batchproof.server.errors import APIError
from batchproof.server.guards.auth import RequireAPIKey, server_api_keys
from batchproof.server.guards.body_limit import BodyLimit
from batchproof.server.guards.connections import ConcurrencyLimit
from batchproof.server.guards.content_type import RequireJSON
from batchproof.server.guards.host_check import RequireKnownHost, allowed_hosts
from batchproof.server.metrics import RequestCounter
from batchproof.server.openapi import install_openapi
from batchproof.server.reply.receipt_facts import tokenizer_sha256
from batchproof.server.responses import route as responses_route
from batchproof.server.state import ServerState
from batchproof.server.trainer import control, load_weights, verify_rollouts


class CatchAll:
    """An unexpected exception becomes a 500 in OpenAI's envelope, and the connection lives on
    (Starlette's own handler re-raises after answering, which drops keep-alive connections)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracking_send(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            if started or scope["type"] != "http":
                raise
            # The exception's text can name files and settings: it goes to the log, under an id
            # the reply gives so that the two can be matched.
            error_id = uuid.uuid4().hex[:12]
            print(f"batchproof: internal error {error_id} on {scope['method']} {scope['path']}", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
            await APIError(500, f"internal error (id {error_id}: the server's log has the details)",
                           type_="server_error").response()(scope, receive, send)


# Starts what runs requests, off the event loop (it may load a model for seconds).
StartBackend = Callable[[ServerState, asyncio.AbstractEventLoop], Backend]


class LocalBackend(AsyncEngine):
    """One engine in this process as the server's Backend: it runs requests, and is its own
    WeightControl (the AsyncEngine swaps its weights, pauses, resumes and aborts)."""

    @property
    def control(self) -> WeightControl:
        return self


def local_backend(engine: Engine | None = None) -> StartBackend:
    """One engine in this process: `engine` (tests share one), else loaded from the config."""

    def start(state: ServerState, loop: asyncio.AbstractEventLoop) -> Backend:
        served = engine or Engine(state.engine_config)
        async_engine = LocalBackend(served, state.engine_config.batch_window_ms / 1000, state.batch_log,
                                   on_failure=lambda: _engine_stopped(state))
        async_engine.start(loop)
        return async_engine

    return start


def _engine_stopped(state: ServerState) -> None:
    if state.on_engine_failure is not None:
        state.on_engine_failure()


def _start_backend(state: ServerState, start: StartBackend, loop: asyncio.AbstractEventLoop) -> None:
    """Runs on a loader thread, so /health answers 503 meanwhile."""
    try:
        backend = start(state, loop)
        model_path = backend.engine.front.model_path
        tokenizer_sha256(backend.engine.front.tokenizer)  # a receipt's, computed once here rather than on the loop
    except Exception as e:  # the server then answers 503 naming it, never waits for a backend that never comes
        state.load_error = load_error_message(e)
        if state.load_error is None:  # a bug: its text (paths, settings) goes to the log, not to clients
            traceback.print_exc(file=sys.stderr)
            state.load_error = f"internal error ({type(e).__name__}; the server's log has the details)"
        if state.on_load_error is not None:
            state.on_load_error()
        return
    state.served_model_name = state.config.served_model_name or model_path.stem
    # Fixed at start: a checkpoint swapped in later does not move where the next may come from.
    state.weights_root = Path(os.path.realpath(state.config.weights_root or model_path.parent))
    state.backend = backend


def create_app(server_config: ServerConfig, engine_config: EngineConfig, engine: Engine | None = None,
               start: StartBackend | None = None) -> FastAPI:
    """engine: an already loaded engine to serve (tests share one); start: what runs requests
    instead of a local engine (a fleet's router); else one engine is loaded at startup."""
    api_keys = server_api_keys(server_config)
    state = ServerState(config=server_config, engine_config=engine_config,
                        prefix_cache_scope=server_config.prefix_cache_scope or ("key" if api_keys else "shared"),
                        api_key_required=bool(api_keys))
    state.served_model_name = server_config.served_model_name or ""
    state.batch_log = BatchLog(state.metrics, server_config.log_file)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loader = threading.Thread(target=_start_backend,
                                  args=(state, start or local_backend(engine), asyncio.get_running_loop()),
                                  name="batchproof-loader", daemon=True)
        loader.start()
        yield
        loader.join()
        if state.backend is not None:
            state.backend.stop()
        state.batch_log.close()

    app = FastAPI(title="batchproof", version=__import__("batchproof").__version__, lifespan=lifespan)
    app.state.server = state
    # In this order, the OpenAPI document lists the routes as it always has.
    for module in (chat_route, completions_route, responses_route, control, admin, load_weights, verify_rollouts):
        app.include_router(module.router)
    responses_route.keep_responses(app)
    install_openapi(app)

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> JSONResponse:
        return error.response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        message = f"{request.method} {request.url.path}: {error.detail}"
        return APIError(error.status_code, message, code="not_found" if error.status_code == 404 else None,
                        headers=dict(error.headers or {})).response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        return APIError(400, f"invalid request: {error.errors()[0].get('msg')}").response()

    app.add_middleware(CatchAll)
    app.add_middleware(RequireJSON)
    app.add_middleware(BodyLimit, limit_bytes=server_config.max_request_bytes)
    app.add_middleware(ConcurrencyLimit, limit=server_config.max_concurrent_requests)
    # Outside the body limit: a stranger's body is not even counted. With a key a rebound name
    # gains nothing (the page cannot know the key), so the Host is checked only without one.
    if api_keys:
        app.add_middleware(RequireAPIKey, api_keys=api_keys)
    elif (hosts := allowed_hosts(server_config)) is not None:
        app.add_middleware(RequireKnownHost, hosts=hosts)
    app.add_middleware(RequestCounter, metrics=state.metrics)  # outermost: counts 401s too
    return app
