"""Runs `batchproof generate` on GGUF files one by one, each in a forked child, and says how each ended.

For the GGUF fuzzer: one process pays for importing torch once, and a child that a bad file
kills (a signal), hangs or ends in a traceback takes only itself down. Reads one path a line
on stdin; writes one JSON object a line on stdout: {"path", "exit", "signal", "timed_out",
"stderr"}.
"""

import json
import os
import signal
import sys
import tempfile
import time
import traceback

from batchproof.cli import main
from batchproof.engine import engine  # noqa: F401  (imported here, once, not in every child)
from batchproof.engine.model.ops import kernels

TRACEBACK_EXIT = 70  # an exception escaped the command: a bug, never a refusal
PROMPT = ["--prompt", "hello", "--max-tokens", "3", "--device", "cpu"]


def _child(path: str, stderr_fd: int) -> None:
    os.dup2(stderr_fd, 2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    try:
        code = main(["generate", "--model", path, *PROMPT])
    except BaseException:
        traceback.print_exc()
        code = TRACEBACK_EXIT
    sys.stderr.flush()
    os._exit(code)


def run_one(path: str, timeout_s: float) -> dict:
    with tempfile.TemporaryFile() as stderr:
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            _child(path, stderr.fileno())
        deadline, status, timed_out = time.monotonic() + timeout_s, 0, False
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                timed_out = True
                break
            time.sleep(0.01)
        stderr.seek(0)
        text = stderr.read().decode("utf-8", errors="replace")
    return {"path": path, "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) and not timed_out else None,
            "timed_out": timed_out, "stderr": text}


if __name__ == "__main__":
    kernels.available()  # the compiled kernels loaded once too (no thread starts: safe to fork)
    timeout = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    for line in sys.stdin:
        print(json.dumps(run_one(line.strip(), timeout)), flush=True)
