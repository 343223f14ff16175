"""Our reading of the GGUFs llama.cpp's own converter (convert_hf_to_gguf.py) writes for the tiny
random mixtures of experts (Qwen3-MoE, OLMoE, Mixtral): the converter's float32 file gives the
directory's tokens, logprobs and routes bitwise, and its F16 and Q8_0 files give, bitwise, those
of the directory whose weights went through F16 or Q8_0 and back (what the converter stores in
that type: every matrix but the norms and the router). So the tensor names, the stacked experts' layout, the Q/K rows
(permuted for Mixtral's llama, not for the others) and the routing keys are read as the converter
writes them, not only as our own test writer does.

The converter is run from a llama.cpp tree: $BATCHPROOF_LLAMA_CPP, else the one vendored by the
llama-cpp-python checkout below; without one the tests are skipped, saying so."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import gguf
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.moe import layer as moe_layer
from batchproof.engine.sampling.params import SamplingParams
from tests.engine.moe_checkpoints import MOE_CONFIGS, write_moe_checkpoint
from tests.hf.checkpoints import as_array

_VENDORED = Path("/work/peer/llama_cpp_python-0.3.36/vendor/llama.cpp")
LLAMA_CPP = Path(os.environ.get("BATCHPROOF_LLAMA_CPP", _VENDORED))
# (trees from before the converter was split into conversion/ keep its classes elsewhere: skipped)
_NEEDED = ("convert_hf_to_gguf.py", "conversion/base.py", "gguf-py/gguf/__init__.py")
pytestmark = pytest.mark.skipif(
    not all((LLAMA_CPP / needed).is_file() for needed in _NEEDED),
    reason=f"no llama.cpp tree with {', '.join(_NEEDED)} at {LLAMA_CPP} (set BATCHPROOF_LLAMA_CPP)")

# The converter as a script, run once per job in one process (its imports take most of a run), with
# two changes that touch only the tokenizer: the tiny vocabulary's pre-tokenizer hash is in no
# table of the converter's (each real model's is), so its `tokenizer.ggml.pre` is given per job;
# and a missing tokenizer.model reads as missing (its llama path tries sentencepiece first, and an
# absent sentencepiece module raised otherwise). argv: the tree, then JSON [[pre, *arguments]...].
_RUN_CONVERTER = """
import json, runpy, sys
from pathlib import Path
tree = Path(sys.argv[1])
sys.path[:0] = [str(tree), str(tree / "gguf-py")]  # its own gguf-py: the installed one may be older
from conversion import base
sentencepiece = base.TextModel._set_vocab_sentencepiece
def _set_vocab_sentencepiece(self, *args, **kwargs):
    if not (self.dir_model / "tokenizer.model").is_file():
        raise FileNotFoundError(self.dir_model / "tokenizer.model")
    return sentencepiece(self, *args, **kwargs)
base.TextModel._set_vocab_sentencepiece = _set_vocab_sentencepiece
for pre, *arguments in json.loads(sys.argv[2]):
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer, pre=pre: pre
    sys.argv = [str(tree / "convert_hf_to_gguf.py"), *arguments]
    runpy.run_path(sys.argv[0], run_name="__main__")
"""
PRE_TOKENIZER = {"qwen3moe": "qwen2", "olmoe": "smollm", "mixtral": "smollm"}  # llama.cpp names for how each splits
ARCH = {"qwen3moe": "qwen3moe", "olmoe": "olmoe", "mixtral": "llama"}
# The converter's qwen3moe has no dense MLP (it cannot name `mlp.down_proj` in a Qwen3-MoE layer):
# its checkpoint routes every layer.
CONVERTIBLE = {"qwen3moe": MOE_CONFIGS["qwen3moe"][:1] + (MOE_CONFIGS["qwen3moe"][1] | {"mlp_only_layers": []},)}
PROMPTS = ["hello the world, and then", "123 456 789"]
GREEDY = SamplingParams(temperature=0, max_tokens=8, top_logprobs=3, ignore_eos=True)


def convert(jobs: list[tuple[Path, str, str]]) -> list[Path]:
    """convert_hf_to_gguf.py on each (directory, name, outtype) -> the files it wrote."""
    outs = [directory.parent / f"{directory.name}-{outtype}.gguf" for directory, _, outtype in jobs]
    arguments = [[PRE_TOKENIZER[name], "--outtype", outtype, "--outfile", str(out), str(directory)]
                 for (directory, name, outtype), out in zip(jobs, outs)]
    done = subprocess.run([sys.executable, "-c", _RUN_CONVERTER, str(LLAMA_CPP), json.dumps(arguments)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"convert_hf_to_gguf.py failed:\n{done.stderr[-3000:]}"
    return outs


def _q8_0(value: np.ndarray) -> np.ndarray:
    q8 = gguf.GGMLQuantizationType.Q8_0
    return gguf.quants.dequantize(gguf.quants.quantize(value, q8), q8).reshape(value.shape)


# outtype -> what the converter does to every matrix but the norms and the router (kept F32)
ROUND_TRIPS = {"f16": lambda value: value.astype(np.float16).astype(np.float32), "q8_0": _q8_0}


def through(directory: Path, outtype: str) -> Path:
    """The directory with every tensor the converter stores as `outtype` replaced by its round
    trip through that type, in float32."""
    out = directory.parent / f"{directory.name}-through-{outtype}"
    shutil.copytree(directory, out)
    state = load_file(directory / "model.safetensors")
    for key, value in state.items():
        if "norm" not in key and not key.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
            state[key] = ROUND_TRIPS[outtype](value)
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """name -> {"hf": the directory, "f32" / "f16" / "q8_0": the converter's GGUF of it in that
    type, "hf-f16" / "hf-q8_0": the directory through that type}."""
    root = tmp_path_factory.mktemp("moe-convert")
    with mock.patch.dict(MOE_CONFIGS, CONVERTIBLE):
        made = {name: {"hf": write_moe_checkpoint(name, root / name)} for name in MOE_CONFIGS}
    jobs = [(made[name]["hf"], name, outtype) for name in MOE_CONFIGS for outtype in ("f32", *ROUND_TRIPS)]
    for (directory, name, outtype), out in zip(jobs, convert(jobs)):
        made[name][outtype] = out
        if outtype in ROUND_TRIPS:
            made[name][f"hf-{outtype}"] = through(directory, outtype)
    return made


def greedy_with_routes(path: Path, monkeypatch) -> tuple[Engine, list[np.ndarray], list[torch.Tensor]]:
    """Greedy records of each prompt (alone) and every MoE layer call's expert ids, in order."""
    engine = Engine(EngineConfig(model_path=path, device="cpu", max_batch=4, num_threads=1, prefix_cache=False,
                                 speculative=False))
    routes: list[torch.Tensor] = []
    route = moe_layer.route

    def recording_route(*args):
        ids, weights = route(*args)
        routes.append(ids.clone())
        return ids, weights

    monkeypatch.setattr(moe_layer, "route", recording_route)
    records = []
    for text in PROMPTS:
        out = engine.generate({"a": (engine.tokenizer.encode(text, add_bos=False), GREEDY)})["a"]
        records.append(as_array([r for delta in out for r in delta.records]))
    monkeypatch.undo()
    return engine, records, routes


@pytest.mark.parametrize("directory,converted_file", [("hf", "f32"), ("hf-f16", "f16"), ("hf-q8_0", "q8_0")])
@pytest.mark.parametrize("name", list(MOE_CONFIGS))
def test_converter_gguf_equals_directory_bitwise(name, directory, converted_file, converted, monkeypatch):
    theirs, their_records, their_routes = greedy_with_routes(converted[name][converted_file], monkeypatch)
    ours, our_records, our_routes = greedy_with_routes(converted[name][directory], monkeypatch)
    # the routing the file's keys (or their absence: llama.cpp's defaults per architecture) give
    # is the config's
    for field in ("num_experts", "num_experts_used", "expert_ffn_dim", "is_topk_normalised", "dense_layers"):
        assert getattr(theirs.model.spec, field) == getattr(ours.model.spec, field), field
    assert gguf.GGUFReader(converted[name][converted_file]).fields["general.architecture"].contents() == ARCH[name]
    for text, a, b in zip(PROMPTS, their_records, our_records):
        assert np.array_equal(a, b), f"{name} {converted_file} {text!r}: tokens/logprobs differ from the directory's"
    assert len(their_routes) == len(our_routes) > 0
    assert all(torch.equal(a, b) for a, b in zip(their_routes, our_routes)), f"{name}: routes differ"
