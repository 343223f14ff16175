"""The ASGI app: routes, errors, metrics, and the engine loaded in the background."""

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from batchproof.engine.async_engine import AsyncEngine
from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.load_errors import load_error_message
from batchproof.server.auth import RequireAPIKey, read_api_keys
from batchproof.server.batch_log import BatchLog
from batchproof.server.body_limit import BodyLimit
from batchproof.server.config import ServerConfig
from batchproof.server.engine_client import Backend
from batchproof.server.errors import APIError
from batchproof.server.metrics import RequestCounter
from batchproof.server.openapi import install_openapi
from batchproof.server.routes import admin, chat, completions, responses
from batchproof.server.state import ServerState


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
        except Exception as error:
            if started or scope["type"] != "http":
                raise
            await APIError(500, f"internal error: {type(error).__name__}: {error}",
                           type_="server_error").response()(scope, receive, send)


# Starts what runs requests, off the event loop (it may load a model for seconds).
StartBackend = Callable[[ServerState, asyncio.AbstractEventLoop], Backend]


def local_backend(engine: Engine | None = None) -> StartBackend:
    """One engine in this process: `engine` (tests share one), else loaded from the config."""

    def start(state: ServerState, loop: asyncio.AbstractEventLoop) -> Backend:
        async_engine = AsyncEngine(engine or Engine(state.engine_config), state.engine_config.batch_window_ms / 1000,
                                   state.batch_log)
        async_engine.start(loop)
        return async_engine

    return start


def _start_backend(state: ServerState, start: StartBackend, loop: asyncio.AbstractEventLoop) -> None:
    """Runs on a loader thread, so /health answers 503 meanwhile."""
    try:
        backend = start(state, loop)
    except Exception as e:
        state.load_error = load_error_message(e) or f"{type(e).__name__}: {e}"
        if state.on_load_error is not None:
            state.on_load_error()
        return
    state.served_model_name = state.config.served_model_name or backend.engine.front.model_path.stem
    state.backend = backend


def create_app(server_config: ServerConfig, engine_config: EngineConfig, engine: Engine | None = None,
               start: StartBackend | None = None) -> FastAPI:
    """engine: an already loaded engine to serve (tests share one); start: what runs requests
    instead of a local engine (a fleet's router); else one engine is loaded at startup."""
    api_keys = read_api_keys(server_config.api_key, server_config.api_key_file)
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
    for module in (chat, completions, responses, admin):
        app.include_router(module.router)
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
    app.add_middleware(BodyLimit, limit_bytes=server_config.max_request_bytes)
    if api_keys:  # outside the body limit: a stranger's body is not even counted
        app.add_middleware(RequireAPIKey, api_keys=api_keys)
    app.add_middleware(RequestCounter, metrics=state.metrics)  # outermost: counts 401s too
    return app
