"""A mixture-of-experts variant batchproof does not run is refused at load with one line naming
the key or tensor (never served with the part it does not implement silently left out)."""

import json

import gguf
import numpy as np
import pytest

from batchproof.engine.model.errors import ModelLoadError
from batchproof.engine.model.gguf.file import read_model_header
from batchproof.engine.model.hf.checkpoint import inspect_checkpoint
from tests.engine.moe_checkpoints import write_moe_checkpoint, write_moe_gguf


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_refused")
    return {name: write_moe_checkpoint(name, root / name) for name in ("qwen3moe", "olmoe", "mixtral")}


def refusal(call, *args) -> str:
    with pytest.raises(ModelLoadError) as caught:
        call(*args)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("name,key,value,named", [
    ("qwen3moe", "shared_expert_intermediate_size", 32, "'shared_expert_intermediate_size'"),
    ("olmoe", "clip_qkv", 8.0, "'clip_qkv'"),
    ("mixtral", "sliding_window", 4, "'sliding_window'"),
    ("olmoe", "num_experts_per_tok", 9, "'num_experts_per_tok'"),
    ("qwen3moe", "norm_topk_prob", "yes", "'norm_topk_prob'"),
    ("qwen3moe", "mlp_only_layers", "1", "'mlp_only_layers'"),
    # more experts than the files could hold: refused at once, naming the last expert's tensor
    ("mixtral", "num_local_experts", 10 ** 8, f"block_sparse_moe.experts.{10 ** 8 - 1}.w1.weight"),
])
def test_a_config_key_we_do_not_run_is_named(name, key, value, named, checkpoints, tmp_path):
    directory = tmp_path / name
    directory.mkdir()
    for file in checkpoints[name].iterdir():
        (directory / file.name).symlink_to(file)
    config = json.loads((checkpoints[name] / "config.json").read_text())
    (directory / "config.json").unlink()
    (directory / "config.json").write_text(json.dumps(config | {key: value}))
    assert named in refusal(inspect_checkpoint, directory)
    inspect_checkpoint(checkpoints[name])  # the checkpoint itself is served


@pytest.mark.parametrize("keys,extra,named", [
    ({"add_expert_shared_count": 1}, {}, "qwen3moe.expert_shared_count"),
    ({"add_expert_gating_func": gguf.ExpertGatingFuncType.SIGMOID}, {}, "qwen3moe.expert_gating_func"),
    ({"add_expert_weights_scale": 2.5}, {}, "qwen3moe.expert_weights_scale"),
    ({}, {"blk.0.ffn_gate_shexp.weight": np.zeros((32, 64), np.float32)}, "blk.0.ffn_gate_shexp.weight"),
    ({}, {"blk.0.exp_probs_b.bias": np.zeros(8, np.float32)}, "blk.0.exp_probs_b.bias"),
])
def test_a_gguf_key_or_tensor_we_do_not_run_is_named(keys, extra, named, checkpoints, tmp_path):
    path = write_moe_gguf("qwen3moe", checkpoints["qwen3moe"], tmp_path / "variant.gguf", extra=extra, **keys)
    assert named in refusal(read_model_header, path)
    read_model_header(write_moe_gguf("qwen3moe", checkpoints["qwen3moe"], tmp_path / "plain.gguf"))


def test_mixtral_is_read_from_llama_with_experts_and_each_moe_layer_needs_its_router(checkpoints, tmp_path):
    meta, _ = read_model_header(write_moe_gguf("mixtral", checkpoints["mixtral"], tmp_path / "mixtral.gguf"))
    assert meta["general.architecture"] == "llama" and meta["llama.expert_count"] == 4
    path = write_moe_gguf("mixtral", checkpoints["mixtral"], tmp_path / "no_router.gguf",
                          drop=("blk.1.ffn_gate_inp.weight",))
    assert "tensor 'blk.1.ffn_gate_inp.weight' is missing" in refusal(read_model_header, path)
