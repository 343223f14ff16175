"""A real uvicorn server on loopback, in a thread, around a given engine."""

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn

from batchproof.engine.config import EngineConfig
from batchproof.server.app import create_app
from batchproof.server.config import ServerConfig
from batchproof.server.guards.connections import uvicorn_config


@dataclass
class LiveServer:
    url: str  # http://127.0.0.1:PORT
    app: object
    log_file: Path | None

    @property
    def state(self):
        return self.app.state.server


@contextlib.contextmanager
def live_server(engine=None, wait_ready: bool = True, **server_settings) -> Iterator[LiveServer]:
    """Serve `engine` (or load the configured model if None) on 127.0.0.1 with a free port."""
    engine_settings = server_settings.pop("engine_settings", {})
    config = ServerConfig(host="127.0.0.1", port=0, **server_settings)
    engine_config = EngineConfig(device="cpu", **engine_settings)
    app = create_app(config, engine_config, engine=engine)
    # The served protocol and bounds (server/guards/connections.py), as `batchproof serve` runs them.
    server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", 0))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    live = LiveServer(url=f"http://127.0.0.1:{port}", app=app, log_file=config.log_file)
    if wait_ready:
        while httpx.get(f"{live.url}/health").status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("engine did not become ready")
            time.sleep(0.05)
    try:
        yield live
    finally:
        server.should_exit = True
        thread.join(timeout=30)
