"""The same bits on every host (issue 61): simulated hosts, one process each, differing as real
ones do in two things at once: torch's vector level (ATEN_CPU_CAPABILITY: default, as on an x86
VM without AVX or, for torch's own code, an ARM host; avx2; avx512) and our kernels' instruction
set (portable, avx2, avx512: --max-isa). Each runs the same mixed batch (greedy and seeded
requests; penalties, logit_bias, top-k, top-p, min-p; top-20, tail and prompt logprobs, raw and
processed) on both packaged models, in both numerics; every token and every logprob's bits
must agree across all of them. Before our kernels owned the sampler, the normaliser of a
processed row and the RoPE tables, torch decided those bits, and hosts disagreed."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from batchproof.engine.model.default_model import default_model_path
from batchproof.engine.model.known_models import resolve_model
from batchproof.engine.model.ops import kernels
from tests.helpers.second_model import gemma_package  # noqa: F401  (a fixture)

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the kernels are not built here")
ROOT = Path(__file__).resolve().parents[2]


def host_pairs() -> list[tuple[str, str]]:
    """(torch's capability, our ISA cap): the plainest host (torch's default, our portable C),
    then ours raised to this CPU's best, then torch's too: each of the two changed alone (first
    to second, second to third) and both at once (first to third); on an AVX-512 host AVX2 for
    both as well. (The fourth corner, torch's best with our portable C, took 46 of the test's
    103 s on a 2-core Zen 2 and changes nothing those three do not.)"""
    best_ours = ["portable", "avx2", "avx512"][kernels.isa_level()]
    best_torch = torch.backends.cpu.get_cpu_capability().lower()  # what torch picks here
    pairs = list(dict.fromkeys([("default", "portable"), ("default", best_ours), (best_torch, best_ours)]))
    if best_torch == "avx512" and best_ours == "avx512":
        pairs.append(("avx2", "avx2"))
    return pairs


def simulate(torch_level: str, isa: str, runs: list[str]) -> dict:
    env = {**os.environ, "ATEN_CPU_CAPABILITY": torch_level, "OMP_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-m", "tests.engine.host_worker", isa, *runs], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["torch"].lower() == torch_level, f"torch ran {report['torch']}, not {torch_level}"
    return report["results"]


def digest(results: dict) -> str:
    return hashlib.sha256(json.dumps(results, sort_keys=True).encode()).hexdigest()[:16]


@pytest.mark.usefixtures("gemma_package")
def test_every_simulated_host_gives_the_same_bits():
    runs = [f"{path}:{numerics}" for path in (default_model_path(), resolve_model("gemma3-270m"))
            for numerics in ("float32", "int8")]
    pairs = host_pairs()
    assert len(pairs) >= 3  # at least torch default/avx2 and ours portable/avx2, each changed alone
    reference = simulate(*pairs[0], runs)
    seeded = reference[runs[0]]["seeded"]
    assert len(seeded["tokens"]) == 8 and len(seeded["records"]) == 8 and len(reference[runs[0]]["greedy"]["prompt"])
    for pair in pairs[1:]:
        got = simulate(*pair, runs)
        for run in runs:
            for request_id, expected in reference[run].items():
                assert got[run][request_id] == expected, (
                    f"{pair} differs from {pairs[0]} on {Path(run).name} {request_id}: "
                    f"{digest(got[run][request_id])} vs {digest(expected)}")
