"""A process's memory figures, from /proc/<pid>/status (Linux)."""

from pathlib import Path


def status_mb(pid: int | str, field: str) -> float | None:
    """`field` of /proc/<pid>/status (VmRSS, VmHWM, RssAnon, ...) in MiB; None where there is
    none (not Linux, or the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return None
