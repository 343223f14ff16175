"""Tiny random checkpoints written by transformers, one per architecture, served from their
directories: our logprobs against transformers' float32 forward, our token ids against its
tokenizer, sharded against single-file, bfloat16 against its float32 upcast, batched against alone."""

import shutil

import numpy as np
import pytest
import torch

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.sampling.params import SamplingParams
from tests.hf.checkpoints import TINY_CONFIGS, as_array, greedy_check, reference_logprobs, tiny_model, write_checkpoint

TEXTS = ["hello the world, and then 123 more! é", "  two  spaces\n\nand\ttabs", "<|im_start|>user\nhi<|im_end|>",
         "<start_of_turn>model\nhello<end_of_turn>", "ünïcödé 日本 🙂"]
GREEDY = SamplingParams(temperature=0, max_tokens=16, top_logprobs=3, ignore_eos=True)


def engine_on(directory, **settings) -> Engine:
    # One thread: on a busy 2-core machine a second one mostly waits at the kernels' barriers
    return Engine(EngineConfig(model_path=directory, device="cpu", max_batch=4, num_threads=1, **settings))


def records(engine: Engine, prompts: dict[str, list[int]], params: SamplingParams = GREEDY) -> dict[str, list]:
    out = engine.generate({rid: (ids, params) for rid, ids in prompts.items()})
    return {rid: [r for delta in deltas for r in delta.records] for rid, deltas in out.items()}


@pytest.mark.parametrize("name", list(TINY_CONFIGS))
def test_logprobs_and_token_ids_equal_transformers(name, tiny_checkpoint):
    from transformers import AutoTokenizer

    directory = tiny_checkpoint(name)
    engine = engine_on(directory)
    theirs = AutoTokenizer.from_pretrained(directory)
    for text in TEXTS:
        assert engine.tokenizer.encode(text, add_bos=engine.tokenizer.ids.add_bos) == theirs(text).input_ids, text
        ids = theirs(text, add_special_tokens=False).input_ids
        assert engine.tokenizer.decode(ids) == theirs.decode(ids), text
    prompt = engine.chat_prompt_ids([{"role": "user", "content": TEXTS[0]}])
    assert prompt == theirs.apply_chat_template([{"role": "user", "content": TEXTS[0]}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
    got = records(engine, {"a": prompt})["a"]
    greedy_check(got, reference_logprobs(directory, prompt + [r.token_id for r in got]), len(prompt))


def test_a_sharded_checkpoint_equals_the_single_file_bitwise(tiny_checkpoint, tmp_path):
    single = tiny_checkpoint("llama")
    sharded = write_checkpoint(tiny_model("llama"), tmp_path / "sharded", "llama", max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file() and len(list(sharded.glob("model-*"))) > 2
    prompts = {"a": engine_on(single).tokenizer.encode(TEXTS[0])}
    a, b = engine_on(single), engine_on(sharded)
    assert np.array_equal(as_array(records(a, prompts)["a"]), as_array(records(b, prompts)["a"]))
    assert a.model_sha256 != b.model_sha256  # other files, another id (the same weights, though)


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_bfloat16_runs_natively_and_equals_its_float32_upcast(name, tiny_checkpoint, tmp_path):
    """The BF16 matmul weights stay BF16 (half the bytes) and give the bits of the same values
    upcast to float32, served natively or dequantized at load; batched == alone."""
    bf16 = tiny_checkpoint(name, torch.bfloat16)
    upcast = tiny_model(name).to(torch.bfloat16).to(torch.float32)
    f32 = write_checkpoint(upcast, tmp_path / "upcast", name)
    native, dequantized, reference = engine_on(bf16), engine_on(bf16, weights="float32"), engine_on(f32)
    assert native.model.weights_nbytes < 0.6 * reference.model.weights_nbytes
    texts = TEXTS[:4]
    prompts = {str(i): native.tokenizer.encode(t, add_bos=native.tokenizer.ids.add_bos) for i, t in enumerate(texts)}
    together = records(native, prompts)
    for rid, ids in prompts.items():
        alone = records(native, {rid: ids})[rid]
        assert np.array_equal(as_array(alone), as_array(together[rid]))
        for other in (dequantized, reference):
            assert np.array_equal(as_array(records(other, {rid: ids})[rid]), as_array(alone))


def test_the_checkpoint_id_names_its_contents(tiny_checkpoint, tmp_path):
    a = tiny_checkpoint("qwen2")
    copy = shutil.copytree(a, tmp_path / "copy")
    other = tiny_checkpoint("qwen2", seed=1)
    ids = [engine_on(d).info()["model_sha256"] for d in (a, copy, other)]
    assert ids[0] == ids[1] != ids[2]
