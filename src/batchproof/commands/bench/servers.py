"""The servers a bench starts: `batchproof serve` (or `fleet`) in a process of its own, used
once healthy, stopped at the end; and the memory they held."""

import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import httpx

from batchproof.common.net import free_port
from batchproof.common.proc_status import status_mb
from batchproof.common.proc_tree import process_tree


def healthy(url: str) -> bool:
    return httpx.get(f"{url}/health", timeout=5).status_code == 200


def start_batchproof(command: list[str], ready: Callable[[str], bool] = healthy, timeout_s: float = 120
                     ) -> tuple[subprocess.Popen, str]:
    """`batchproof <command> --port P` in its own process, once `ready(url)` -> (process, url)."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="batchproof-bench-", suffix=".log", delete=False)
    process = subprocess.Popen([sys.executable, "-m", "batchproof", *command, "--port", str(port)], stdout=log,
                               stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if ready(url):
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    process.wait()
    raise RuntimeError(f"batchproof {' '.join(command)} did not come up; see {log.name}")


def start_serve(model: Path | None, serve_args: list[str]) -> tuple[subprocess.Popen, str]:
    """`batchproof serve` with the bench's `--model` and these extra flags."""
    return start_batchproof(["serve", *serve_args, *(["--model", str(model)] if model else [])])


def stop(processes: Iterable[subprocess.Popen], timeout_s: float = 30) -> None:
    """SIGTERM to every one first (they shut down side by side), then a kill for any still up."""
    processes = list(processes)
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def peak_rss_mb(pid: int) -> float | None:
    """The peak resident memory of a running process (None off Linux, or once it is gone)."""
    return status_mb(pid, "VmHWM")


def own_peak_rss_mb() -> float:
    """The peak resident memory of this process (the engine measured in process)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def tree_rss_mb(root: int) -> dict[str, float]:
    """Resident memory of a process and every descendant, by command (Ray's processes are the
    fleet process's children and grandchildren)."""
    by_name: dict[str, float] = {}
    for pid in process_tree(root):
        rss = status_mb(pid, "VmRSS")
        try:
            name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            title = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if rss is None:
            continue
        key = name if name.startswith("ray::") else (Path(name).name or title)
        by_name[key] = by_name.get(key, 0.0) + rss
    return by_name
