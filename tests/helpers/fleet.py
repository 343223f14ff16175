"""A real fleet for tests: `batchproof fleet` in its own process (a local Ray instance, the
replicas, the ingress on loopback), as a user starts it."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from batchproof.common.net import free_port

START_TIMEOUT_S = 300  # Ray's start and N model loads on two busy cores


@dataclass
class Fleet:
    url: str
    process: subprocess.Popen
    log: Path

    def info(self) -> dict:
        return httpx.get(f"{self.url}/v1/server_info", timeout=10).json()

    def alive_replicas(self) -> list[dict]:
        return [r for r in self.info()["fleet"]["replicas"] if r["alive"]]


@contextlib.contextmanager
def running_fleet(log: Path, replicas: int = 2, *flags: str) -> Iterator[Fleet]:
    port = free_port()
    command = [sys.executable, "-m", "batchproof", "fleet", "--replicas", str(replicas), "--threads-per-replica",
               "1", "--port", str(port), "--device", "cpu", *flags]
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=os.environ | {
            "RAY_DEDUP_LOGS": "0"})
    fleet = Fleet(f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"batchproof fleet exited ({process.returncode}):\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"batchproof fleet did not come up:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{fleet.url}/health", timeout=5).status_code == 200 and \
                        len(fleet.alive_replicas()) == replicas:
                    break
            time.sleep(0.5)
        yield fleet
    finally:
        process.send_signal(signal.SIGTERM)  # its own shutdown ends the Ray instance it started
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
