"""A seeded request's tokens, and every logprob's bits, the same under two torch releases
installed side by side (issue 61): this venv's torch (the pin) and the one in the venv that
BATCHPROOF_SECOND_TORCH_VENV names (the oldest pyproject accepts, torch 2.4.0, in the last
result: bench/results/torch-releases-*.json). bench/torch_releases.py runs both packaged models,
both numerics, greedy and seeded requests under each and compares them; skipped without a second
venv, which takes a download of its own."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from batchproof.engine.model.ops import kernels
from tests.helpers.second_model import gemma_package  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parents[2]
VARIABLE = "BATCHPROOF_SECOND_TORCH_VENV"
SECOND = os.environ.get(VARIABLE, "").strip()



def releases_script():
    spec = importlib.util.spec_from_file_location("torch_releases", ROOT / "bench" / "torch_releases.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_flipped_bit_or_token_is_a_difference():
    """The comparison can fail: one logprob's last bit, then one token, changed in a copy."""
    differences = releases_script().differences
    reference = {"m.gguf:int8": {"seeded": {"tokens": [5, 7], "records": [[5, "3f000000"]], "prompt": []},
                                 "greedy": {"tokens": [1], "records": [], "prompt": []}}}
    assert differences(reference, json.loads(json.dumps(reference))) == []
    flipped = json.loads(json.dumps(reference))
    flipped["m.gguf:int8"]["seeded"]["records"][0][1] = "3f000001"
    (line,) = differences(reference, flipped)
    assert line.startswith("m.gguf:int8 seeded: same tokens")
    flipped["m.gguf:int8"]["seeded"]["tokens"][1] = 8
    assert differences(reference, flipped)[0].startswith("m.gguf:int8 seeded: other tokens")
    del flipped["m.gguf:int8"]["greedy"]  # a record the second torch did not return differs too
    assert len(differences(reference, flipped)) == 2


@pytest.mark.skipif(not SECOND, reason=f"{VARIABLE} names no venv with a second torch release (python -m venv DIR; "
                                       f"DIR/bin/pip install torch==2.4.0 and the serve extra's packages)")
@pytest.mark.skipif(not kernels.available(), reason="the kernels are not built here")
@pytest.mark.usefixtures("gemma_package")
def test_two_torch_releases_give_the_same_bits(tmp_path):
    out = tmp_path / "releases.json"
    done = subprocess.run([sys.executable, "bench/torch_releases.py", sys.executable, SECOND, "--torch-levels", "best",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert out.exists(), done.stderr[-3000:]
    result = json.loads(out.read_text())
    ours, second = (venv["torch"] for venv in result["venvs"])
    assert ours == torch.__version__ and second != ours, f"{VARIABLE} must hold another torch release, not {second}"
    assert len(result["runs"]) == 4 and {"greedy", "seeded"} <= set(result["requests"])
    (row,) = result["levels"]
    assert row["differences"] == [], f"torch {ours} and {second} differ"
    assert all(len(tokens) == 8 for tokens in row["seeded_tokens"].values())
    assert done.returncode == 0, done.stdout
