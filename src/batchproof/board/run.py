"""The board: every server of the board file, and its negative controls, probed in every
configuration it lists, twice; a server that cannot be reached or started gets rows saying so and
the rest still run. The board is valid only when every control was caught."""

import dataclasses
import os
import platform
import socket
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import httpx

from batchproof.board import drift_server
from batchproof.board.cell import NOT_RUN, RUNS, UNREACHABLE, Target, cell, is_caught, kept_witness, run_once
from batchproof.board.launch import Started, start
from batchproof.board.spec import BoardSpec, ServerSpec
from batchproof.check.contract import Contract
from batchproof.common.printable import printable
from batchproof.probe.matrix import Matrix

BOARD_VERSION = 1
DRIFT = "drift"  # the built-in control's `builtin`
DRIFT_NAME = "drift control (built in)"
NO_BATCH_INVARIANT = "--no-batch-invariant"


def with_controls(spec: BoardSpec) -> list[ServerSpec]:
    """The board's servers, then its negative controls: the built-in drift server always, and our own
    server without batch invariance when the board starts ours by command (the first such entry)."""
    controls = [ServerSpec(name=DRIFT_NAME, configurations=("identical",), is_control=True, builtin=DRIFT)]
    ours = next((s for s in spec.servers if s.is_ours and not s.is_control), None)
    if ours is not None and ours.command is not None:
        controls.append(dataclasses.replace(
            ours, name=f"{ours.name} {NO_BATCH_INVARIANT}", command=(*ours.command, NO_BATCH_INVARIANT),
            configurations=("identical",), is_control=True))
    return [*spec.servers, *controls]


def say(line: str) -> None:
    print(printable(f"board: {line}"), file=sys.stderr, flush=True)


def slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in name).strip("-") or "server"


@contextmanager
def reached(server: ServerSpec, workdir: Path, host: str):
    """The server as a probe target (started first when it has a command), or why it is not one."""
    if server.builtin == DRIFT:
        log = workdir / "batch.log"
        with drift_server.DriftServer(log) as drift:
            # It serves no model file: its source is what it serves, named by its sha256 as a model is.
            source = Path(drift_server.__file__)
            yield Target(url=drift.url, model=source, server_log=log, host=host, commit="builtin", binary=source)
        return
    if server.url is not None:
        yield target(server, server.url, None, None, host)
        return
    started = start(server, workdir)
    if isinstance(started, str):
        yield started
        return
    try:
        uses_log = any("{log}" in word for word in server.command or ())
        yield target(server, started.url, started, started.log if uses_log else None, host)
    finally:
        started.stop()


def target(server: ServerSpec, url: str, started: Started | None, log: Path | None, host: str) -> Target:
    """What the witness names: the board file's identity, else what the server says of itself
    (ours: /v1/server_info's build and commit), else the executable the board started."""
    info = server_info(url)
    binary = server.binary or (started.binary if started is not None and server.binary_sha256 is None
                               and not info.get("build_sha256") else None)
    return Target(url=url, model=server.model, server_log=log, probe=dict(server.probe), host=host,
                  commit=server.commit or info.get("git_commit"), binary=binary,
                  binary_sha256=server.binary_sha256 or info.get("build_sha256"))


def server_info(url: str) -> dict[str, Any]:
    """/v1/server_info's non-blank strings (ours says its build and commit there); {} where there is none."""
    try:
        response = httpx.get(f"{url}/v1/server_info", timeout=10)
        doc = response.json() if response.is_success else None
    except (httpx.HTTPError, ValueError):
        doc = None
    if not isinstance(doc, dict):
        return {}
    return {key: value for key, value in doc.items() if isinstance(value, str) and value.strip()}


def not_run(server: ServerSpec, configuration: str, why: str) -> dict[str, Any]:
    return {"server": server.name, "configuration": configuration, "control": server.is_control,
            "verdict": NOT_RUN, "agree": None, "why": why, "runs": []}


def all_kept(server: ServerSpec, workdir: Path) -> bool:
    """Every run of every configuration of the server has a measured witness in `workdir` already."""
    return all(kept_witness(workdir / f"{configuration}-run{n}.json") is not None
               for configuration in server.configurations for n in range(1, RUNS + 1))


def server_rows(server: ServerSpec, matrix_path: Path | None, matrix: Matrix, contract: Contract,
                workdir: Path, host: str, resume: bool = False) -> list[dict[str, Any]]:
    workdir.mkdir(parents=True, exist_ok=True)
    # Resumed, a server whose runs all have witnesses is checked again without being started.
    with nullcontext() if resume and all_kept(server, workdir) else reached(server, workdir, host) as found:
        if isinstance(found, str):
            say(f"{server.name}: {found}")
            return [not_run(server, c, found) for c in server.configurations]
        rows: list[dict[str, Any]] = []
        unreachable = None  # once a run could not connect, the server's other configurations are not run
        for configuration in server.configurations:
            if unreachable is not None:
                rows.append(not_run(server, configuration, f"unreachable: {unreachable}"))
                continue
            rows.append(configuration_row(server, configuration, found, matrix_path, matrix, contract, workdir,
                                          resume))
            unreachable = rows[-1]["why"] if rows[-1]["verdict"] == UNREACHABLE else None
        return rows


def configuration_row(server: ServerSpec, configuration: str, found: Target | None, matrix_path: Path | None,
                      matrix: Matrix, contract: Contract, workdir: Path, resume: bool = False) -> dict[str, Any]:
    runs = []
    for n in range(1, RUNS + 1):
        say(f"{server.name} · {configuration} · run {n} of {RUNS}")
        run = run_once(found, configuration, matrix_path, matrix, contract, workdir, f"{configuration}-run{n}",
                       resume)
        runs.append({**run, "witness": f"{workdir.name}/{run['witness']}",
                     "report": run["report"] and f"{workdir.name}/{run['report']}"})
        say(f"{server.name} · {configuration} · run {n}: {run['verdict']}")
        if run["unreachable"] is not None:
            break
    return {"server": server.name, "configuration": configuration, "control": server.is_control, **cell(runs)}


def validity(rows: list[dict[str, Any]]) -> list[str]:
    """Why the board is invalid (empty: valid): a control that was not caught failing."""
    controls = [row for row in rows if row["control"]]
    if not controls:
        return ["the board ran no negative control"]
    return [f"negative control {row['server']} · {row['configuration']} was {row['verdict']}, not caught "
            "NOT ADMISSIBLE for batching in both runs" for row in controls if not is_caught(row)]


def machine() -> str:
    """The CPU the board ran on, as /proc/cpuinfo names it (where there is one), and its core count."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            name = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), None)
    except OSError:
        name = None
    return f"{name or platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def run_board(spec: BoardSpec, matrix: Matrix, contract: Contract, out: Path,
              clock: Callable[[], float] = time.time, resume: bool = False) -> dict[str, Any]:
    host = spec.host or socket.gethostname()
    started = clock()
    rows = []
    for i, server in enumerate(with_controls(spec)):
        # Numbered: two names may read alike as folder names.
        rows += server_rows(server, spec.matrix, matrix, contract, out / f"{i:02d}-{slug(server.name)}", host,
                            resume)
    invalid = validity(rows)
    return {"board_version": BOARD_VERSION, "host": host, "machine": machine(), "started": started,
            "seconds": round(clock() - started, 1),
            "matrix": {"n_predict": matrix.n_predict, "ladder": list(matrix.ladder)},
            "contract": {"bands": list(contract.bands), "decode_ratio_c4_over_c1": contract.decode_ratio_c4_over_c1,
                         "require_bitwise_logprobs": contract.require_bitwise_logprobs},
            "runs_per_cell": RUNS, "resumed": resume, "valid": not invalid, "invalid_because": invalid, "rows": rows}
