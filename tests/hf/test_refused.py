"""Checkpoint directories we cannot serve: each refused with one line naming the file and the
problem (a ModelLoadError, as for a GGUF), never a traceback; `batchproof serve` prints it and exits 2."""

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.errors import ModelLoadError


def _edit_config(**changes) -> Callable[[Path], None]:
    def edit(directory: Path) -> None:
        path = directory / "config.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | changes))
    return edit


def _edit_tensors(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(directory: Path) -> None:
        path = directory / "model.safetensors"
        tensors = load_file(path)
        edit(tensors)
        save_file(tensors, path, metadata={"format": "pt"})
    return apply


def _remove(name: str) -> Callable[[Path], None]:
    return lambda directory: (directory / name).unlink()


def _index_naming_a_missing_shard(directory: Path) -> None:
    (directory / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}))


UP = "model.layers.1.mlp.up_proj.weight"
# case -> (how the directory is broken, the file the line names, what it says)
CASES: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "no config.json": (_remove("config.json"), "config.json", "no such file"),
    "config.json not JSON": (lambda d: (d / "config.json").write_text("{oops"), "config.json", "not a JSON file"),
    "unknown model_type": (_edit_config(model_type="mistral"), "config.json", "model_type 'mistral' is not supported"),
    "quantized": (_edit_config(quantization_config={"quant_method": "gptq"}), "config.json",
                  "quantization_config ('gptq') is not supported"),
    "unsupported activation": (_edit_config(hidden_act="relu"), "config.json", "key 'hidden_act' is 'relu'"),
    "unsupported rope": (_edit_config(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}),
                         "config.json", "RoPE type 'yarn' is not supported"),
    "missing key": (_edit_config(hidden_size=None), "config.json", "key 'hidden_size' is None, not an integer"),
    "vocab_size disagrees": (_edit_config(vocab_size=301), "config.json", "'vocab_size' is 301 but"),
    "no safetensors": (_remove("model.safetensors"), "tiny", "no model.safetensors nor model.safetensors.index.json"),
    "index names a missing shard": (_index_naming_a_missing_shard, "model.safetensors.index.json",
                                    "names 'model-00002-of-00002.safetensors', which is not a file"),
    "not safetensors": (lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 64), "model.safetensors",
                        "not a readable safetensors file"),
    "missing tensor": (_edit_tensors(lambda t: t.pop(UP)), "tiny", f"tensor '{UP}' is missing"),
    "wrong shape": (_edit_tensors(lambda t: t.__setitem__(UP, t[UP][:-1].clone())), "model.safetensors",
                    f"tensor '{UP}' has shape [95, 64], but config.json makes it [96, 64]"),
    "int8 tensor": (_edit_tensors(lambda t: t.__setitem__(UP, t[UP].to(torch.int8))), "model.safetensors",
                    f"tensor '{UP}' has dtype I8; we read F32, F16, BF16"),
    "a tensor the model would ignore": (
        _edit_tensors(lambda t: t.__setitem__("model.layers.0.self_attn.o_proj.bias", torch.zeros(64))),
        "model.safetensors", "tensor 'model.layers.0.self_attn.o_proj.bias' is not part of a llama model"),
    "a layer too many": (_edit_config(num_hidden_layers=1), "model.safetensors",
                         "is not part of a llama model with num_hidden_layers = 1"),
    "no tokenizer.json": (_remove("tokenizer.json"), "tokenizer.json", "no such file"),
    "tokenizer.json not a tokenizer": (lambda d: (d / "tokenizer.json").write_text("{}"), "tokenizer.json",
                                       "not a tokenizer the tokenizers library reads"),
}


@pytest.fixture
def broken(tiny_checkpoint, tmp_path) -> Callable[[str], Path]:
    def make(case: str) -> Path:
        directory = shutil.copytree(tiny_checkpoint("llama"), tmp_path / "tiny")
        CASES[case][0](directory)
        return directory
    return make


@pytest.mark.parametrize("case", list(CASES))
def test_refused_with_one_line_naming_the_file(case, broken):
    directory = broken(case)
    _, file_name, said = CASES[case]
    with pytest.raises(ModelLoadError) as error:
        Engine(EngineConfig(model_path=directory, device="cpu", max_batch=1, num_threads=1))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(str(directory / file_name) if file_name != "tiny" else str(directory)), message
    assert said in message, message


def test_serve_prints_the_line_and_exits_2(broken):
    directory = broken("wrong shape")
    done = subprocess.run([sys.executable, "-m", "batchproof", "serve", "--model", str(directory), "--port", "0",
                           "--device", "cpu"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"batchproof serve: {directory / 'model.safetensors'}: tensor '{UP}' has shape [95, 64], but config.json "
        "makes it [96, 64] (intermediate_size = 96, hidden_size = 64)")
