"""A board server started by its command: a free port, its output to a file, polled until ready,
stopped with everything it started. A command that cannot start, exits, or is not ready in time
is a reason (a row of the board), never an exception that stops the board."""

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from batchproof.board.spec import ServerSpec
from batchproof.common.net import free_port

POLL_S = 0.25
STOP_WITHIN_S = 30.0


def fill(text: str, port: int, log: Path) -> str:
    """A command word, `ready` URL or probe option with the placeholders filled in."""
    url = f"http://127.0.0.1:{port}"
    return text.replace("{port}", str(port)).replace("{url}", url).replace("{log}", str(log))


@dataclass
class Started:
    url: str
    process: subprocess.Popen
    output: Path  # its stdout and stderr
    log: Path  # what {log} named: its batch log, when its command writes one there
    binary: Path | None  # the executable that was started

    def stop(self) -> None:
        """The process and its children (its own session): TERM, then KILL if it lingers."""
        if self.process.poll() is None:
            _signal(self.process, signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_WITHIN_S)
            except subprocess.TimeoutExpired:
                _signal(self.process, signal.SIGKILL)
                self.process.wait(timeout=STOP_WITHIN_S)


def _signal(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return f": {lines[-1][:200]}" if lines else ""


def start(server: ServerSpec, workdir: Path) -> Started | str:
    """The server running and ready, or why not (one line)."""
    assert server.command is not None
    port = free_port()
    output, log = workdir / "output.txt", workdir / "batch.log"
    argv = [fill(word, port, log) for word in server.command]
    ready = fill(server.ready or "{url}/v1/models", port, log)
    executable = shutil.which(argv[0])
    if executable is None:
        return f"command not found: {argv[0]}"
    with output.open("wb") as sink:
        try:
            process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        except OSError as error:
            return f"cannot start {argv[0]}: {error.strerror}"
    started = Started(f"http://127.0.0.1:{port}", process, output, log, Path(executable))
    why = _wait_ready(started, ready, server.ready_timeout_s)
    if why is not None:
        started.stop()
        return why
    return started


def _wait_ready(started: Started, ready: str, timeout_s: float) -> str | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = started.process.poll()
        if code is not None:
            return f"exited with status {code} before it was ready{_last_line(started.output)}"
        try:
            if httpx.get(ready, timeout=5).status_code == 200:
                return None
        except httpx.HTTPError:
            pass
        time.sleep(POLL_S)
    return f"not ready within {timeout_s:g} s ({ready} never answered 200){_last_line(started.output)}"
