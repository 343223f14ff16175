"""A crafted GGUF is refused in one line, never run: the measured cases (a RoPE width past the
head, an MLP size below the tensors', which overwrote the heap), one per check, and a fuzzer
that rewrites tiny files' metadata and tensor headers and runs `batchproof generate` on each
in a forked child: a one-line refusal (exit 2) or a working model (exit 0), never a signal,
a hang or a traceback."""

import itertools
import json
import math
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from batchproof.engine.model import known_models
from batchproof.engine.model.errors import ModelLoadError
from batchproof.engine.model.gguf.file import read_model_file, read_model_header
from batchproof.engine.model.known_models import UnknownModel, resolve_model
from tests.helpers.tiny_gguf import TinySpec, hf_weights, vocab, write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]
Q = gguf.GGMLQuantizationType
LLAMA = TinySpec()  # dim 64, 4 heads of 16, 2 KV heads, MLP 96, 2 layers
MATMULS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
# The fuzzer's starting points: the fused decode step on quantized blocks (llama), with QKV
# biases on float32 (qwen2), and with Q/K norms, windows and post-norms (gemma3).
BASES = {
    "llama-q8_0": TinySpec("llama", tensor_types={f"blk.{i}.{m}.weight": Q.Q8_0 for i in range(2) for m in MATMULS}),
    "qwen2": TinySpec("qwen2", pre="qwen2", seed=1),
    "gemma3": TinySpec("gemma3", num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, seed=4),
}
NUM_TOKENS = len(vocab()[0])
Outcome = dict  # load_worker.py's report on one file


# --- running files through `batchproof generate`, each in its own child -----------------------


@pytest.fixture(scope="module")
def generate() -> Iterator[Callable[[Path], Outcome]]:
    """`batchproof generate --model PATH` in a forked child of one worker (load_worker.py)."""
    worker = subprocess.Popen([sys.executable, "-m", "tests.engine.load_worker", "60"], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(path: Path) -> Outcome:
        worker.stdin.write(f"{path}\n")
        worker.stdin.flush()
        line = worker.stdout.readline()
        assert line, "the load worker died"
        return json.loads(line)

    yield run
    worker.stdin.close()
    worker.wait(timeout=60)


def assert_clean(outcome: Outcome, what: str) -> None:
    """A one-line refusal (exit 2), a working model (exit 0), or a model that loads and fails
    its request closed (exit 1, one line): a well-formed file whose weights are garbage (an F32
    norm read as F16 holds NaNs) is no load error, and no check could rule all such out; the
    engine then refuses to choose from NaN logits. Nothing else: no signal, hang or traceback."""
    tail = outcome["stderr"][-3000:]
    assert not outcome["timed_out"], f"{what}: hung\n{tail}"
    assert outcome["signal"] is None, f"{what}: killed by signal {outcome['signal']}\n{tail}"
    assert outcome["exit"] in (0, 1, 2), f"{what}: exit {outcome['exit']}\n{tail}"
    if outcome["exit"] in (1, 2):
        lines = outcome["stderr"].strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("batchproof generate: "), f"{what}: not one line\n{tail}"


def refusal(outcome: Outcome, what: str) -> str:
    assert_clean(outcome, what)
    assert outcome["exit"] == 2, f"{what}: ran; it should have been refused"
    return outcome["stderr"].strip()


# --- rewriting a file in place, as the measured case was made ---------------------------------


def copy_of_tiny(tmp_path: Path, spec: TinySpec = LLAMA, name: str = "evil.gguf") -> Path:
    path = tmp_path / name
    write_tiny_gguf(path, spec)
    return path


def rewrite_key(path: Path, key: str, value: float) -> None:
    """A metadata value rewritten in place with gguf-py's reader (r+), as the issue measured."""
    reader = gguf.GGUFReader(path, "r+")
    reader.fields[key].parts[-1][0] = value
    reader.data.flush()


def rewrite_tensor(path: Path, name: str, part: str, value: int | bytes) -> None:
    """One field of a tensor's header: "name", "n_dims", "dims", "type" or "offset"."""
    reader = gguf.GGUFReader(path, "r+")
    field = next(t.field for t in reader.tensors if t.name == name)
    index = {"name": 1, "n_dims": 2, "dims": 3, "type": 4, "offset": 5}[part]
    if isinstance(value, bytes):
        field.parts[index][:] = np.frombuffer(value, dtype=np.uint8)
    else:
        field.parts[index][0] = value
    reader.data.flush()


def refused_in_process(path: Path) -> str:
    with pytest.raises(ModelLoadError) as caught:
        read_model_file(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message, message
    return message


# --- the measured cases, through the command --------------------------------------------------


def test_a_rope_width_past_the_head_is_refused_not_run(tmp_path: Path, generate) -> None:
    """Measured: rope.dimension_count 4096 (a 64-wide head) let RoPE write past its rows;
    glibc aborted on the overwritten heap."""
    path = copy_of_tiny(tmp_path)
    rewrite_key(path, "llama.rope.dimension_count", 4096)
    line = refusal(generate(path), "rope.dimension_count = 4096")
    assert "llama.rope.dimension_count" in line and "4096" in line and "head size 16" in line, line
    with pytest.raises(ModelLoadError):  # a fleet's ingress, which reads only the header, refuses it too
        read_model_header(path)


def test_an_mlp_size_below_the_tensors_is_refused_not_run(tmp_path: Path, generate) -> None:
    """feed_forward_length 48 against 96-row tensors: the fused decode step's buffer, sized
    from the metadata, would take the tensors' 192 columns."""
    path = copy_of_tiny(tmp_path)
    rewrite_key(path, "llama.feed_forward_length", 48)
    line = refusal(generate(path), "feed_forward_length = 48")
    assert "'blk.0.ffn_gate.weight'" in line and "llama.feed_forward_length = 48" in line, line
    assert "[64, 96]" in line and "[64, 48]" in line, line


def test_the_untouched_tiny_files_run(tmp_path: Path, generate) -> None:
    """The fuzzer's starting points load and generate (else every mutation would be refused)."""
    for name, spec in BASES.items():
        outcome = generate(copy_of_tiny(tmp_path, spec, f"{name}.gguf"))
        assert outcome["exit"] == 0, outcome["stderr"][-3000:]


# --- each check, in process, with the line it gives --------------------------------------------


@pytest.mark.parametrize(("key", "value", "words"), [
    ("llama.rope.dimension_count", 15, ["must be even"]),
    ("llama.attention.head_count_kv", 3, ["head_count 4 is not a multiple of", "head_count_kv 3"]),
    ("llama.attention.head_count", 0, ["'llama.attention.head_count' is 0"]),
    ("llama.embedding_length", 2**32 - 1, ["'llama.embedding_length' is 4294967295"]),
    ("llama.block_count", 3, ["'blk.2.attn_norm.weight' is missing"]),
    ("llama.block_count", 1, ["'blk.1.attn_norm.weight' is not part of a llama model", "block_count = 1"]),
    ("llama.rope.freq_base", math.nan, ["'llama.rope.freq_base' is nan"]),
    ("llama.attention.layer_norm_rms_epsilon", -1.0, ["'llama.attention.layer_norm_rms_epsilon' is -1.0"]),
    ("tokenizer.ggml.bos_token_id", NUM_TOKENS, [f"'tokenizer.ggml.bos_token_id' is {NUM_TOKENS}",
                                                 f"0..{NUM_TOKENS - 1}"]),
    ("tokenizer.ggml.eos_token_id", 2**32 - 1, ["'tokenizer.ggml.eos_token_id' is 4294967295"]),
])
def test_a_bad_hyperparameter_or_token_id_is_named(tmp_path: Path, key: str, value: float, words: list[str]) -> None:
    path = copy_of_tiny(tmp_path)
    rewrite_key(path, key, value)
    message = refused_in_process(path)
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(("part", "value", "words"), [
    ("n_dims", 5, ["'blk.0.attn_k.weight' has 5 dimensions"]),
    ("dims", 0, ["'blk.0.attn_k.weight' has a dimension of 0"]),
    ("dims", 48, ["'blk.0.attn_k.weight' has shape [48, 32]", "[64, 32]", "llama.embedding_length = 64"]),
    ("type", 99, ["'blk.0.attn_k.weight' has unknown type 99"]),
    ("type", int(Q.Q4_K), ["'blk.0.attn_k.weight' has rows of 64 values, not a multiple", "block of 256"]),
    ("offset", 4, ["'blk.0.attn_k.weight' starts at offset", "not a multiple of the alignment 32"]),
    ("offset", 0, ["overlap"]),
    ("offset", 2**63, ["'blk.0.attn_k.weight' runs past the end of the file"]),
    ("name", b"blk.0.attn_q.weight", ["'blk.0.attn_q.weight' appears twice"]),
    ("name", b"blk.00attn_kxweight", ["'blk.0.attn_k.weight' is missing"]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_bad_tensor_header_is_named(tmp_path: Path, part: str, value: int | bytes, words: list[str]) -> None:
    path = copy_of_tiny(tmp_path)
    rewrite_tensor(path, "blk.0.attn_k.weight", part, value)
    message = refused_in_process(path)
    for word in words:
        assert word in message, message


def test_a_key_that_is_not_a_number_is_named(tmp_path: Path) -> None:
    """The value's type rewritten (uint32 -> float32, same width): a count must be an integer."""
    path = copy_of_tiny(tmp_path)
    reader = gguf.GGUFReader(path, "r+")
    reader.fields["llama.context_length"].parts[2][0] = int(gguf.GGUFValueType.FLOAT32)
    reader.data.flush()
    assert "'llama.context_length' is 1.79" in refused_in_process(path)


@pytest.mark.parametrize("alignment", [0, 3])
def test_an_alignment_that_is_not_a_power_of_two_is_named(tmp_path: Path, alignment: int) -> None:
    """llama.block_count renamed general.alignment (the same length), set to 0 or 3."""
    path = copy_of_tiny(tmp_path)
    reader = gguf.GGUFReader(path, "r+")
    field = reader.fields["llama.block_count"]
    field.parts[1][:] = np.frombuffer(b"general.alignment", dtype=np.uint8)
    field.parts[-1][0] = alignment
    reader.data.flush()
    assert f"general.alignment {alignment} is not a power of two" in refused_in_process(path)


def write_with(tmp_path: Path, spec: TinySpec, change: Callable[[dict[str, np.ndarray]], None]) -> Path:
    weights = hf_weights(spec)
    change(weights)
    path = tmp_path / "changed.gguf"
    write_tiny_gguf(path, spec, weights)
    return path


def test_a_missing_or_foreign_tensor_is_named(tmp_path: Path) -> None:
    path = write_with(tmp_path, LLAMA, lambda w: w.pop("blk.1.ffn_up.weight"))
    assert "tensor 'blk.1.ffn_up.weight' is missing" in refused_in_process(path)
    path = write_with(tmp_path, TinySpec("qwen3", pre="qwen2"), lambda w: w.pop("blk.0.attn_k_norm.weight"))
    assert "tensor 'blk.0.attn_k_norm.weight' is missing" in refused_in_process(path)
    path = write_with(tmp_path, TinySpec("qwen2", pre="qwen2"), lambda w: w.pop("blk.1.attn_v.bias"))
    assert "tensor 'blk.1.attn_v.bias' is missing" in refused_in_process(path)
    # a llama layer with a Q norm: the fused decode step would skip what prefill applied
    path = write_with(tmp_path, LLAMA, lambda w: w.update({"blk.0.attn_q_norm.weight": np.ones(16, np.float32)}))
    assert "'blk.0.attn_q_norm.weight' is not part of a llama model" in refused_in_process(path)


def test_an_embedding_without_a_row_per_token_is_named(tmp_path: Path) -> None:
    def drop_last_row(w: dict[str, np.ndarray]) -> None:
        w["token_embd.weight"], w["output.weight"] = w["token_embd.weight"][:-1], w["output.weight"][:-1]

    message = refused_in_process(write_with(tmp_path, LLAMA, drop_last_row))
    assert f"tokenizer.ggml.tokens has {NUM_TOKENS} entries but token_embd.weight has {NUM_TOKENS - 1} rows" in message
    path = write_with(tmp_path, LLAMA, lambda w: w.update({"output.weight": w["output.weight"][:-1]}))
    message = refused_in_process(path)
    assert f"'output.weight' has shape [64, {NUM_TOKENS - 1}], but the metadata makes it [64, {NUM_TOKENS}]" in message


# --- the default model's checksum --------------------------------------------------------------


def test_the_default_model_by_name_is_checked_against_its_sha256(tmp_path: Path, monkeypatch) -> None:
    assert resolve_model(None).name == "SmolLM2-135M-Instruct.Q4_1.gguf"  # the real file passes
    impostor = copy_of_tiny(tmp_path, name="SmolLM2-135M-Instruct.Q4_1.gguf")
    monkeypatch.setattr(known_models, "default_model_path", lambda: impostor)
    with pytest.raises(UnknownModel) as caught:
        resolve_model("smollm2-135m")
    message = str(caught.value)
    assert "\n" not in message and str(impostor) in message and "sha256" in message, message
    assert resolve_model(impostor) == impostor  # a path is the user's own file: not the packaged model


# --- the fuzzer -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """One number in a file's header: where it is, its type, and what it is."""

    at: int
    dtype: np.dtype
    what: str


def header_fields(path: Path) -> dict[str, list[Field]]:
    """The numbers a crafted header can change, by kind: metadata values, token ids, counts and
    lengths, value types, and tensor headers (dimension count, dimensions, type, offset)."""
    reader = gguf.GGUFReader(path)
    base = reader.data.ctypes.data
    kinds: dict[str, list[Field]] = {"value": [], "token_id": [], "count": [], "type": [], "tensor": []}

    def add(kind: str, part: np.ndarray, what: str) -> None:
        for i in range(part.size):
            kinds[kind].append(Field(part.ctypes.data - base + i * part.itemsize, part.dtype, what))

    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            if key != "GGUF.version":
                add("count", field.parts[0], key)
            continue
        add("type", field.parts[2], f"{key}'s value type")
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            add("type", field.parts[3], f"{key}'s item type")
            add("count", field.parts[4], f"{key}'s count")
        elif kind == gguf.GGUFValueType.STRING:
            add("count", field.parts[3], f"{key}'s length")
        else:
            add("token_id" if key.endswith("_token_id") else "value", field.parts[3], key)
    for tensor in reader.tensors:
        for index, part in ((2, "n_dims"), (3, "dims"), (4, "type"), (5, "offset")):
            add("tensor", tensor.field.parts[index], f"{tensor.name} {part}")
    return kinds


MODES = ("zero", "one", "minus_one", "plus_one", "minus_a_bit", "double", "half", "4096", "max", "nan", "random")


def mutated_value(field: Field, original: np.generic, mode: str, noise: int) -> bytes:
    """The field's new bytes: an edge value, a near miss of the original, or noise."""
    if field.dtype.kind == "b":
        return np.array([not original], dtype=field.dtype).tobytes()
    width = field.dtype.itemsize * 8
    if field.dtype.kind == "f":
        value = float(original)
        table = {"zero": 0.0, "one": 1.0, "minus_one": -1.0, "plus_one": value + 1, "minus_a_bit": value * 0.99,
                 "double": value * 2, "half": value / 2, "4096": 4096.0, "max": math.inf, "nan": math.nan}
        if mode in table:
            return np.array([table[mode]], dtype=field.dtype).tobytes()
        return np.array([noise % 2**width], dtype=f"<u{width // 8}").view(field.dtype).tobytes()
    value = int(original)
    table = {"zero": 0, "one": 1, "minus_one": -1, "plus_one": value + 1, "minus_a_bit": value - 1,
             "double": value * 2, "half": value // 2, "4096": 4096, "max": 2**(width - 1) - 1}
    new = table.get(mode, noise)
    return np.array([new % 2**width], dtype=f"<u{width // 8}").view(field.dtype).tobytes()


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, tuple[bytes, dict[str, list[Field]]]]:
    directory = tmp_path_factory.mktemp("bases")
    out = {}
    for name, spec in BASES.items():
        path = directory / f"{name}.gguf"
        write_tiny_gguf(path, spec)
        out[name] = (path.read_bytes(), header_fields(path))
    return out


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


MUTATION = st.tuples(st.sampled_from(("value", "tensor", "token_id", "count", "type")), st.integers(0, 2**16),
                     st.sampled_from(MODES), st.integers(0, 2**64 - 1))
NAMES = itertools.count()


@settings(max_examples=45, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(sorted(BASES)), mutations=st.lists(MUTATION, min_size=1, max_size=3))
def test_a_mutated_header_is_refused_in_one_line_or_runs(bases, fuzz_dir: Path, generate, base: str,
                                                         mutations: list[tuple[str, int, str, int]]) -> None:
    original, kinds = bases[base]
    data = bytearray(original)
    said = []
    for kind, pick, mode, noise in mutations:
        field = kinds[kind][pick % len(kinds[kind])]
        before = np.frombuffer(original, dtype=field.dtype, count=1, offset=field.at)[0]
        new = mutated_value(field, before, mode, noise)
        data[field.at:field.at + len(new)] = new
        said.append(f"{field.what}: {before} -> {np.frombuffer(new, dtype=field.dtype)[0]}")
    path = fuzz_dir / f"{next(NAMES)}.gguf"
    path.write_bytes(data)
    outcome = generate(path)
    assert_clean(outcome, f"{base} with {'; '.join(said)}")
    event("ran" if outcome["exit"] == 0 else "refused")
    path.unlink()
