"""`batchproof witness`: serve a model (the default one unless --model; on a fleet of replicas with
--fleet N), probe it, check the witness, in one command."""

import argparse
import json
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

from batchproof.commands import check as check_verb
from batchproof.commands import probe as probe_verb
from batchproof.common.net import free_port

DEFAULT_OUT = Path("witness.json")
HEALTHY_WITHIN_S = {"serve": 180, "fleet": 600}  # a fleet starts Ray, then loads the model once per replica


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the witness file [default: {DEFAULT_OUT}]")
    parser.add_argument("--model", help="GGUF file or packaged model name (default: smollm2-135m)")
    parser.add_argument("--ladder", help="concurrencies to probe (default: the matrix's, 1,4,8,16)")
    parser.add_argument("--contract", type=Path, help="contract for the check (default: the shipped one)")
    parser.add_argument("--serve-arg", action="append", default=[],
                        help="extra flag for `batchproof serve` (or `batchproof fleet`)")
    parser.add_argument("--matrix", type=Path,
                        help="the probe's policy file (a perf-matrix.yaml) in place of the shipped one: its "
                             "tokens per request, bands and witness thresholds")
    parser.add_argument("--cache", action="store_true",
                        help="also measure the prefix cache: each prompt cold, then warm (the probe's --cache)")
    parser.add_argument("--fleet", type=int, metavar="N",
                        help="serve with `batchproof fleet --replicas N` (Ray Serve: pip install -e '.[fleet]') and "
                             "probe it with --fleet, so the witness also shows the replicas agree")


def serve_command(args: argparse.Namespace, port: int, server_log: Path) -> list[str]:
    """The server to start: `batchproof serve`, or with --fleet N `batchproof fleet --replicas N`."""
    verb = ["fleet", "--replicas", str(args.fleet)] if args.fleet is not None else ["serve"]
    command = [sys.executable, "-m", "batchproof", *verb, "--port", str(port), "--log-file", str(server_log),
               *args.serve_arg]
    return command + (["--model", str(args.model)] if args.model else [])


def probe_arguments(args: argparse.Namespace, url: str, server_log: Path, info: dict, commit: str | None
                    ) -> list[str]:
    """`batchproof probe`'s arguments for the server started (its /v1/server_info: `info`)."""
    probe = ["--url", url, "--server-log", str(server_log), "--witness", str(args.out),
             "--model-file", info["model_path"], "--binary-sha256", info["build_sha256"], "--host", info["host"]]
    if commit:
        probe += ["--commit", commit]
    if args.ladder:
        probe += ["--ladder", args.ladder]
    if args.matrix:
        probe += ["--matrix", str(args.matrix)]
    if args.cache:
        probe += ["--cache"]
    if args.fleet is not None:
        probe += ["--fleet"]
    return probe


def _wait_healthy(url: str, process: subprocess.Popen, log: Path, verb: str) -> dict:
    import httpx

    deadline = time.monotonic() + HEALTHY_WITHIN_S[verb]
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"batchproof {verb} exited with {process.returncode}; see {log}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return httpx.get(f"{url}/v1/server_info", timeout=10).json()
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"batchproof {verb} was not healthy within {HEALTHY_WITHIN_S[verb]} s; see {log}")


def _model_contract(model: str | None) -> Path | None:
    """A packaged model's own contract (check/contracts/), when it has one; else the default."""
    from importlib import resources

    from batchproof.check.contract import SHIPPED_FOR_MODEL

    if model not in SHIPPED_FOR_MODEL:
        return None
    return Path(str(resources.files("batchproof.check").joinpath(SHIPPED_FOR_MODEL[model])))


def _run_verb(verb: types.ModuleType, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"batchproof {verb.__name__.rsplit('.', 1)[-1]}")
    verb.add_arguments(parser)
    return verb.run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    from batchproof.server.info import build_sha256, git_commit

    if args.fleet is not None and args.fleet < 2:
        # One replica has no other to agree with: its fleet verdict could only be UNMEASURABLE.
        print(f"witness: --fleet needs at least 2 replicas, got {args.fleet}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="batchproof-witness-"))
    server_log, stderr_log = workdir / "batch.log", workdir / "serve.log"
    port = free_port()
    command = serve_command(args, port, server_log)
    verb = "fleet" if args.fleet is not None else "serve"
    url = f"http://127.0.0.1:{port}"
    print(f"witness: starting {' '.join(command[2:])}", file=sys.stderr)
    with stderr_log.open("wb") as err:
        process = subprocess.Popen(command, stdout=err, stderr=subprocess.STDOUT)
    try:
        info = _wait_healthy(url, process, stderr_log, verb)
        # The server reports the build it runs; it must be the one this command would vouch for.
        if info.get("build_sha256") != build_sha256():
            print(f"witness: the server reports build {info.get('build_sha256')}, not ours ({build_sha256()})",
                  file=sys.stderr)
            return 1
        probe_code = _run_verb(probe_verb, probe_arguments(args, url, server_log, info,
                                                           info.get("git_commit") or git_commit()))
    except RuntimeError as e:
        print(f"witness: {e}", file=sys.stderr)
        return 1
    finally:
        process.terminate()
        process.wait(timeout=30)
    if not args.out.is_file():
        print(f"witness: the probe wrote no witness (exit {probe_code})", file=sys.stderr)
        return probe_code or 1
    contract = args.contract or _model_contract(args.model)
    check = [str(args.out)] + (["--contract", str(contract)] if contract else [])
    code = _run_verb(check_verb, check)
    verdict = json.loads(args.out.read_text()).get("result")
    print(f"witness: probe {verdict}, witness at {args.out}")
    return code
