"""Reading GGUF files: hyperparameters and tensors as written, and one clear line for a bad file."""

from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchproof.engine.model.errors import ModelLoadError
from batchproof.engine.model.gguf.file import read_model_file
from tests.helpers.tiny_gguf import TinySpec, file_weights, write_tiny_gguf

Q = gguf.GGMLQuantizationType


def our_name(gguf_name: str) -> str:
    names = {"token_embd.weight": "embed", "output_norm.weight": "final_norm", "output.weight": "lm_head",
             "attn_norm.weight": "attn_norm", "attn_q.weight": "wq", "attn_k.weight": "wk", "attn_v.weight": "wv",
             "attn_q.bias": "bq", "attn_k.bias": "bk", "attn_v.bias": "bv", "attn_q_norm.weight": "q_norm",
             "attn_k_norm.weight": "k_norm", "attn_output.weight": "wo", "ffn_norm.weight": "ffn_norm",
             "ffn_gate.weight": "w_gate", "ffn_up.weight": "w_up", "ffn_down.weight": "w_down"}
    if gguf_name.startswith("blk."):
        _, layer, rest = gguf_name.split(".", 2)
        return f"layers.{layer}.{names[rest]}"
    return names[gguf_name]


def assert_one_line_naming(error: BaseException, path: Path, *words: str) -> None:
    message = str(error)
    assert "\n" not in message, message
    assert str(path) in message, message
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("spec", [
    TinySpec("llama"),
    TinySpec("qwen2", pre="qwen2"),
    TinySpec("qwen3", head_dim=24, pre="qwen2"),
    TinySpec("llama", tie_embeddings=True, num_kv_heads=4, rope_base=500000.0),
], ids=["llama", "qwen2", "qwen3-head-dim-24", "llama-tied-mha"])
def test_hyperparameters_and_f32_tensors_read_back_as_written(tmp_path: Path, spec: TinySpec) -> None:
    path = tmp_path / "m.gguf"
    weights = write_tiny_gguf(path, spec)
    model = read_model_file(path)
    s = model.spec
    assert (s.arch, s.num_layers, s.dim, s.ffn_dim, s.num_heads, s.num_kv_heads, s.head_dim, s.context_len) == \
        (spec.arch, spec.num_layers, spec.dim, spec.ffn_dim, spec.num_heads, spec.num_kv_heads, spec.hd,
         spec.context_len)
    assert s.vocab_size == weights["token_embd.weight"].shape[0]
    assert s.rope_base == spec.rope_base and s.rope_dim == spec.hd
    assert s.rope_style == ("adjacent" if spec.arch == "llama" else "halves")
    assert np.float32(s.norm_eps) == np.float32(spec.norm_eps)
    stored = file_weights(spec, weights)
    assert set(model.tensors) == {our_name(n) for n in stored}
    for name, array in stored.items():
        got = model.tensors[our_name(name)]
        assert got.dtype == np.float32 and got.shape == array.shape, name
        assert np.array_equal(got, array), name
    assert ("lm_head" in model.tensors) == (not spec.tie_embeddings)


def test_f16_and_q8_0_tensors_dequantize_to_what_was_stored(tmp_path: Path) -> None:
    spec = TinySpec(tensor_types={"token_embd.weight": Q.F16, "blk.0.ffn_down.weight": Q.Q8_0,
                                  "blk.1.attn_q.weight": Q.Q8_0})
    path = tmp_path / "mixed.gguf"
    weights = file_weights(spec, write_tiny_gguf(path, spec))
    tensors = read_model_file(path).tensors
    embed = weights["token_embd.weight"]
    assert np.array_equal(tensors["embed"], embed.astype(np.float16).astype(np.float32))
    for gguf_name, ours in (("blk.0.ffn_down.weight", "layers.0.w_down"), ("blk.1.attn_q.weight", "layers.1.wq")):
        original = weights[gguf_name]
        got = tensors[ours]
        assert got.shape == original.shape
        # Q8_0: 32 values share one fp16 scale max|x| / 127; rounding is within half a step.
        blocks = np.abs(original).reshape(original.shape[0], -1, 32).max(-1, keepdims=True) / 127
        bound = np.broadcast_to(blocks, (*blocks.shape[:2], 32)).reshape(original.shape) * 0.51 + 1e-6
        assert np.all(np.abs(got - original) <= bound + np.abs(original) * 1e-3)
        assert not np.array_equal(got, original), "really quantized"


def test_a_tensor_type_we_cannot_read_is_an_error_naming_the_tensor(tmp_path: Path) -> None:
    path = tmp_path / "q8_1.gguf"
    write_tiny_gguf(path, TinySpec(tensor_types={"blk.1.attn_v.weight": Q.Q8_1}))
    with pytest.raises(ModelLoadError) as caught:
        read_model_file(path)
    assert_one_line_naming(caught.value, path, "blk.1.attn_v.weight", "Q8_1")


def test_an_unsupported_architecture_is_named(tmp_path: Path) -> None:
    path = tmp_path / "gpt2.gguf"
    write_tiny_gguf(path, TinySpec(arch="gpt2", num_layers=1))
    with pytest.raises(ModelLoadError) as caught:
        read_model_file(path)
    assert_one_line_naming(caught.value, path, "'gpt2'")


@pytest.mark.parametrize("key", ["llama.block_count", "llama.embedding_length", "llama.context_length",
                                 "llama.attention.layer_norm_rms_epsilon"])
def test_a_missing_hyperparameter_is_named(tmp_path: Path, key: str) -> None:
    path = tmp_path / "missing-key.gguf"
    write_tiny_gguf(path, TinySpec(num_layers=1), drop_keys=(key,))
    with pytest.raises(ModelLoadError) as caught:
        read_model_file(path)
    assert_one_line_naming(caught.value, path, key)


def test_bad_paths_are_one_line_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "dir.gguf").mkdir()
    (tmp_path / "empty.gguf").write_bytes(b"")
    (tmp_path / "text.gguf").write_text("hello, not a model\n")
    (tmp_path / "magic-only.gguf").write_bytes(b"GGUF")
    (tmp_path / "version-99.gguf").write_bytes(b"GGUF" + (99).to_bytes(4, "little") + bytes(16))
    for name in ["missing.gguf", "dir.gguf", "empty.gguf", "text.gguf", "magic-only.gguf", "version-99.gguf"]:
        with pytest.raises(ModelLoadError) as caught:
            read_model_file(tmp_path / name)
        assert_one_line_naming(caught.value, tmp_path / name)


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory) -> tuple[bytes, int]:
    """A tiny GGUF's bytes and where its last tensor's data ends."""
    path = tmp_path_factory.mktemp("trunc") / "whole.gguf"
    write_tiny_gguf(path, TinySpec(num_layers=1))
    reader = gguf.GGUFReader(path)
    end = max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)  # offsets are from the file start
    return path.read_bytes(), end


def test_the_whole_tiny_file_reads(tiny_bytes, tmp_path: Path) -> None:
    data, end = tiny_bytes
    assert end <= len(data)
    path = tmp_path / "copy.gguf"
    path.write_bytes(data)
    assert read_model_file(path).spec.num_layers == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fraction=st.floats(0.0, 1.0, exclude_max=True))
def test_every_truncation_is_one_line_naming_the_file(tiny_bytes, tmp_path: Path, fraction: float) -> None:
    data, end = tiny_bytes
    cut = int(fraction * end)
    path = tmp_path / f"cut-{cut}.gguf"
    path.write_bytes(data[:cut])
    with pytest.raises(ModelLoadError) as caught:
        read_model_file(path)
    assert_one_line_naming(caught.value, path)


def test_our_header_reader_gives_what_gguf_py_gives(tmp_path: Path) -> None:
    """Metadata values and tensor bytes equal gguf-py's GGUFReader on the default model and a tiny file."""
    from batchproof.engine.model.default_model import default_model_path
    from batchproof.engine.model.gguf.reader import read_gguf

    tiny = tmp_path / "tiny.gguf"
    write_tiny_gguf(tiny, TinySpec(num_layers=1))
    for path in (tiny, default_model_path()):
        reader = gguf.GGUFReader(path)
        metadata, tensors = read_gguf(path)
        expected = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
        assert metadata == expected
        assert [t.name for t in tensors] == [t.name for t in reader.tensors]
        for ours, theirs in zip(tensors, reader.tensors):
            assert ours.qtype == int(theirs.tensor_type)
            assert ours.shape == tuple(int(d) for d in reversed(theirs.shape))
            assert ours.data.tobytes() == np.asarray(theirs.data).tobytes()
