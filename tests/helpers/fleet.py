"""A real fleet for tests: `batchproof fleet` in its own process (a local Ray instance, the
replicas, the ingress on loopback), as a user starts it."""

import contextlib
import ipaddress
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
from batchproof.common.proc_tree import process_tree

START_TIMEOUT_S = 300  # Ray's start and N model loads on two busy cores
TCP_LISTEN = "0A"  # the state column of /proc/net/tcp{,6}


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket of a process: where it accepts connections from."""

    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int
    pid: int
    command: str

    @property
    def is_loopback(self) -> bool:
        # 0.0.0.0 and :: (every interface) are not loopback; ::ffff:127.x is.
        address = self.address
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return address.is_loopback

    def __str__(self) -> str:
        return f"{self.address}:{self.port} ({self.command[:120]}, pid {self.pid})"


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """/proc/net/tcp{,6}'s spelling: 32-bit words in host (little-endian) byte order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def _listening_inodes() -> dict[int, tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    """socket inode -> (address, port) of every listening TCP socket in this network namespace."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == TCP_LISTEN:
                address, port = fields[1].split(":")
                found[int(fields[9])] = (_address(address), int(port, 16))
    return found


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    with contextlib.suppress(OSError):  # the process ended, or its fds are not ours to read
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def listeners(root: int) -> list[Listener]:
    """Every listening TCP socket held by `root` or a process descended from it (a fleet's Ray
    processes: GCS, raylet, agents, the Serve controller, the replicas)."""
    listening = _listening_inodes()
    found = []
    for pid in sorted(process_tree(root)):
        command = ""
        with contextlib.suppress(OSError):
            # Whole: a checkout's path can push the program's name (gcs_server) past any cut (CI's did).
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        found += [Listener(*listening[inode], pid, command.strip())
                  for inode in _socket_inodes(pid) if inode in listening]
    return found


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
