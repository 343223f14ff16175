"""`batchproof bench --write-model`: a random-weight GGUF in a small llama shape, written by
the CLI, loads in our engine with the default model's tokenizer, holds the tensor types
llama.cpp's quantize gives its mix, weights of variance 1/K, and finite, ordinary logits."""

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from batchproof.cli import main
from batchproof.commands.bench import random_model
from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.gguf.reader import read_gguf
from batchproof.engine.model.known_models import resolve_model
from batchproof.engine.sampling.params import SamplingParams

Q = gguf.GGMLQuantizationType
# Eight layers, so Q4_K_M's 6-bit layers are a proper subset; dims a multiple of the K-quants' 256.
TINY = random_model.Shape(num_layers=8, dim=256, ffn_dim=512, num_heads=4, num_kv_heads=2, context_len=256)
# llama.cpp's use_more_bits, worked by hand for 8 layers: i < 1, i >= 7, (i - 1) % 3 == 2
MORE_BITS_OF_8 = {0, 3, 6, 7}
EMBED_ROWS_CHECKED = 4096


@pytest.fixture(scope="module", params=random_model.MIXES)
def written(request, tmp_path_factory) -> tuple[str, Path]:
    """The file, written through the CLI with the tiny shape added to the named ones."""
    path = tmp_path_factory.mktemp("random_model") / f"{request.param}.gguf"
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(random_model.SHAPES, "tiny", TINY)
        assert main(["bench", "--write-model", str(path), "--shape", "tiny", "--mix", request.param]) == 0
    return request.param, path


def test_the_tensor_types_are_llama_cpps_for_the_mix(written) -> None:
    mix, path = written
    _, entries = read_gguf(path)
    types = {e.name: Q(e.qtype) for e in entries}
    assert types["token_embd.weight"] == Q.Q6_K  # tied embeddings: quantized as the output
    assert "output.weight" not in types
    for i in range(TINY.num_layers):
        for short in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            want = (Q.Q4_0 if mix == "q4_0" else
                    Q.Q6_K if short in ("attn_v", "ffn_down") and i in MORE_BITS_OF_8 else Q.Q4_K)
            assert types[f"blk.{i}.{short}.weight"] == want, (i, short)
        assert types[f"blk.{i}.attn_norm.weight"] == Q.F32


def test_an_unknown_mix_or_shape_is_one_line_and_no_file(tmp_path, capsys) -> None:
    for flags in (["--mix", "q5_k_m"], ["--shape", "llama-70b"]):
        assert main(["bench", "--write-model", str(tmp_path / "x.gguf"), *flags]) == 2
        assert flags[1] in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_llama_1b_q4_k_m_gives_half_its_layers_six_bits() -> None:
    # llama.cpp's rule at 16 layers: i < 2, i >= 14, (i - 2) % 3 == 2
    assert {i for i in range(16) if random_model.use_more_bits(i, 16)} == {0, 1, 4, 7, 10, 13, 14, 15}


def test_the_tokenizer_is_the_default_models(written) -> None:
    _, path = written
    ours, _ = read_gguf(path)
    default, _ = read_gguf(resolve_model(None))
    tokenizer_keys = {k for k in default if k.startswith("tokenizer.")}
    assert tokenizer_keys and {k: ours[k] for k in tokenizer_keys} == {k: default[k] for k in tokenizer_keys}


def test_every_matrix_has_weights_of_variance_one_over_k(written) -> None:
    """gguf's own dequantization of the blocks: mean about 0, standard deviation 1/sqrt(K)."""
    _, path = written
    _, entries = read_gguf(path)
    for e in entries:
        if e.qtype == Q.F32:
            assert np.all(e.data == 1.0), e.name  # the norms: ones
            continue
        rows = e.data[:EMBED_ROWS_CHECKED]  # the embedding's 49,152 rows: a sample is enough
        w = gguf.quants.dequantize(rows, Q(e.qtype)).reshape(len(rows), -1)
        k = e.shape[1]
        want = random_model.LOGIT_STD / np.sqrt(TINY.dim) if e.name == "token_embd.weight" else 1 / np.sqrt(k)
        assert np.isfinite(w).all(), e.name
        assert abs(float(w.std()) / want - 1) < 0.05, e.name
        assert abs(float(w.mean())) < 0.05 * want, e.name


@torch.inference_mode()
def test_our_engine_loads_it_and_decodes_finite_ordinary_logits(written) -> None:
    _, path = written
    engine = Engine(EngineConfig(model_path=path, device="cpu", max_batch=1))
    assert engine.spec.num_layers == TINY.num_layers and engine.spec.vocab_size == 49152
    prompt = engine.chat_prompt_ids([{"role": "user", "content": "Hello there"}])
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, top_logprobs=5)
    records = [r for out in engine.generate({"a": (prompt, params)})["a"] for r in out.records]
    assert len(records) == 4
    for r in records:
        logits = [t.logit for t in r.top]
        assert np.isfinite(logits).all() and np.isfinite(r.logprob)
        # ordinary: the greedy token above a flat row's -log(vocab), the top five not all equal
        assert -np.log(engine.spec.vocab_size) < r.logprob < 0 and logits[0] > logits[-1]


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="no /proc/cpuinfo")
def test_a_run_names_the_cpus_isa_flags() -> None:
    """The comparison on the 1B file turns on the matmul each server picks: the JSON says which it could."""
    from batchproof.commands.bench import machine

    first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    flags = next(line.split(":", 1)[1].split() for line in first.splitlines() if line.startswith("flags"))
    described = machine.describe()
    assert described["cpu_flags"] == [f for f in machine.ISA_FLAGS if f in flags]
    assert all(f in machine.line(described) for f in described["cpu_flags"])
