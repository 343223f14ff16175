"""What machine a bench ran on, in its results: ratios against a peer move with the CPU (the same
code ran 1.18x llama-server's single stream on one and 0.78x on a Zen 1, whose 256-bit
instructions run as two halves), so a figure is read beside the CPU that made it."""

import os
import platform
import socket
from pathlib import Path
from typing import Any

from batchproof.engine.model.ops import kernels

# The /proc/cpuinfo flags that decide which matmul a server runs (ours and llama.cpp's): AVX2 and
# FMA, AVX-512, and the integer dot products (VNNI in its 512-bit and its AVX2 spelling).
ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16")


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields from /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def describe() -> dict[str, Any]:
    info = _cpuinfo()
    cpu = info.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in info:
        cpu += f" (vendor {info.get('vendor_id', '?')}, family {info['cpu family']}, model {info.get('model', '?')})"
    isa = kernels.ISA_NAMES[kernels.isa_level()] if kernels.available() else "none (torch)"
    flags = set(info.get("flags", "").split())
    return {"cpus": os.cpu_count(), "host": socket.gethostname(), "cpu": cpu, "kernels_isa": isa,
            "cpu_flags": [f for f in ISA_FLAGS if f in flags]}


def line(machine: dict[str, Any]) -> str:
    flags = f" ({' '.join(machine['cpu_flags']) or 'no AVX2'})" if "cpu_flags" in machine else ""  # older files: none
    return (f"machine: {machine.get('cpu', '?')}, {machine.get('cpus', '?')} CPUs{flags}, "
            f"kernels at {machine.get('kernels_isa', '?')}")
