"""The tokenizer and chat template against Hugging Face's and llama.cpp's ids, and byte round trips."""

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchproof.engine.model.errors import ModelLoadError
from batchproof.engine.model.gguf.file import read_model_file
from batchproof.engine.model.gguf.tokenizer import gguf_tokenizer
from batchproof.engine.text.chat_formats import choose_chat_template
from batchproof.engine.text.tokenizer import PackedBytes, Tokenizer
from tests.helpers.tiny_gguf import TinySpec, token_id, write_tiny_gguf

REFERENCE = json.loads((Path(__file__).parent / "reference" / "hf_reference.json").read_text())
VECTORS = REFERENCE["tokenizer"]


@pytest.fixture(scope="module")
def tokenizer(engine) -> Tokenizer:
    return engine.tokenizer


def test_the_vectors_cover_what_the_issue_asks_for() -> None:
    texts = "".join(v["text"] for v in VECTORS)
    for needed in ("é", "日本", "🎉", "def ", "   ", "\t\t", "2024", "<|im_start|>", "<|endoftext|>"):
        assert needed in texts
    assert all("llama_cpp_ids" in v for v in VECTORS)


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: repr(v["text"][:24]))
def test_ids_equal_hugging_face_and_llama_cpp(tokenizer: Tokenizer, vector: dict) -> None:
    ids = tokenizer.encode(vector["text"])
    assert ids == vector["hf_ids"]
    assert ids == vector["llama_cpp_ids"]
    assert b"".join(tokenizer.decode_bytes(i) for i in ids) == vector["text"].encode("utf-8")
    assert tokenizer.decode(ids) == vector["text"]


# SmolLM2's vocabulary has no token for these bytes (nor does any merge contain them): text
# made of them cannot be encoded by Hugging Face, llama.cpp or us. They are control characters
# and the UTF-8 lead bytes of planes 4-11 (U+40000-U+BFFFF, unassigned); 0xC0, 0xC1, 0xF5-0xFF
# never occur in UTF-8.
BYTES_WITHOUT_TOKEN = {0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, *range(0xF5, 0x100)}
encodable_chars = st.characters(exclude_categories=("Cs",)).filter(
    lambda c: not BYTES_WITHOUT_TOKEN.intersection(c.encode("utf-8")))


def single_byte_tokens(tokenizer: Tokenizer) -> set[int]:
    return {b[0] for i in range(tokenizer.vocab_size) if len(b := tokenizer.decode_bytes(i)) == 1
            and i not in tokenizer.special_ids}


def test_the_bytes_without_a_token_are_exactly_the_known_ones(tokenizer: Tokenizer) -> None:
    assert set(range(256)) - single_byte_tokens(tokenizer) == BYTES_WITHOUT_TOKEN


def test_a_byte_without_a_token_is_dropped_and_nothing_else(tokenizer: Tokenizer) -> None:
    """Hugging Face's BPE (no unk token) and llama.cpp drop such bytes too; nothing around them is lost."""
    text = "a\x04b \U00040000c"
    raw = b"".join(tokenizer.decode_bytes(i) for i in tokenizer.encode(text))
    assert raw == bytes(b for b in text.encode() if b not in BYTES_WITHOUT_TOKEN)


@settings(max_examples=200, deadline=None)
@given(text=st.text(encodable_chars, max_size=40))
def test_decode_bytes_round_trips_any_encodable_text(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    assert b"".join(tokenizer.decode_bytes(i) for i in ids) == text.encode("utf-8")
    assert tokenizer.decode(ids) == text


@settings(max_examples=100, deadline=None)
@given(parts=st.lists(st.one_of(st.sampled_from(["<|im_start|>", "<|im_end|>", "<|endoftext|>", "\n", " "]),
                                st.text(alphabet="abé 日🎉<|>_", max_size=6)), max_size=8))
def test_special_spellings_round_trip_inside_text(tokenizer: Tokenizer, parts: list[str]) -> None:
    text = "".join(parts)
    assert b"".join(tokenizer.decode_bytes(i) for i in tokenizer.encode(text)) == text.encode("utf-8")


def spelled(tokenizer: Tokenizer, spelling: str) -> int:
    """The id whose spelling in the file is `spelling`."""
    return next(i for i in range(tokenizer.vocab_size) if tokenizer.spelling(i) == spelling)


def test_special_tokens(tokenizer: Tokenizer) -> None:
    im_end = spelled(tokenizer, "<|im_end|>")
    assert tokenizer.encode("<|im_end|>") == [im_end]
    assert tokenizer.decode_bytes(im_end) == b"<|im_end|>" and tokenizer.token_text(im_end) == "<|im_end|>"
    assert im_end in tokenizer.ids.end_of_turn_ids
    assert tokenizer.ids.eos_id == im_end
    assert spelled(tokenizer, "<|im_start|>") not in tokenizer.ids.end_of_turn_ids
    assert tokenizer.encode("x<|im_start|>y") == [tokenizer.encode("x")[0], spelled(tokenizer, "<|im_start|>"),
                                                  tokenizer.encode("y")[0]]


def test_token_text_replaces_a_broken_sequence_but_bytes_stay_exact(tokenizer: Tokenizer) -> None:
    first, middle, last = tokenizer.encode("🎉")
    assert tokenizer.decode_bytes(first) + tokenizer.decode_bytes(middle) + tokenizer.decode_bytes(last) == \
        "🎉".encode()
    assert tokenizer.decode_bytes(middle) == b"\x8e"
    assert tokenizer.token_text(middle) == "\ufffd"


@pytest.mark.parametrize("case", REFERENCE["chat"], ids=lambda c: c["prompt"][:20])
def test_chat_prompt_ids_equal_hugging_face(engine, case: dict) -> None:
    assert engine.chat_prompt_ids([{"role": "user", "content": case["prompt"]}]) == case["prompt_ids"]


def test_chat_template_renders_like_the_hand_written_chatml(engine) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    expected = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n")
    assert engine.front.chat_template.render(messages, add_generation_prompt=False) == expected
    assert engine.front.chat_template.render(messages) == expected + "<|im_start|>assistant\n"
    default_system = engine.front.chat_template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert default_system.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_a_file_without_template_gets_chatml_only_if_its_vocabulary_spells_it() -> None:
    template, origin = choose_chat_template(None, {"<|im_start|>", "<|im_end|>"}, "", "")
    assert "ChatML" in origin
    rendered = template.render([{"role": "user", "content": "Hi"}])
    assert rendered == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert choose_chat_template(None, {"<s>", "</s>"}, "", "")[0] is None  # never a guessed format


# --- the tiny vocabulary: merges, pre-tokenizers, specials -----------------------------------


@pytest.fixture(scope="module")
def tiny_metadata(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("tok") / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(num_layers=1))
    return read_model_file(path).metadata


def test_tiny_merges_apply_in_rank_order(tiny_metadata: dict) -> None:
    tok = gguf_tokenizer(tiny_metadata)
    assert tok.encode("hello the and") == [token_id("hell"), ord("o"), token_id("Ġthe"), token_id("Ġand")]
    assert tok.encode("and") == [ord("a"), ord("n"), ord("d")], "no merge for 'a n' without the space"
    assert tok.encode("x<|im_end|>") == [ord("x"), token_id("<|im_end|>")]
    assert tok.ids.end_of_turn_ids == {token_id("<|im_end|>"), token_id("<|endoftext|>")}
    assert tok.decode_bytes(token_id("Ġthe")) == b" the"


@pytest.mark.parametrize("pre,expected", [
    ("gpt2", [ord("\n"), ord("\n")]),  # GPT-2's regex: whitespace before a word is split off
    ("qwen2", [token_id("ĊĊ")]),  # Qwen's \s*[\r\n]+ keeps the newline run whole
])
def test_the_pre_tokenizer_follows_tokenizer_ggml_pre(tiny_metadata: dict, pre: str, expected: list[int]) -> None:
    tok = gguf_tokenizer(tiny_metadata | {"tokenizer.ggml.pre": pre})
    assert tok.encode("\n\nand") == expected + [ord("a"), ord("n"), ord("d")]


def test_an_unknown_pre_tokenizer_is_a_load_error_naming_the_file(tmp_path: Path) -> None:
    from batchproof.engine.config import EngineConfig
    from batchproof.engine.engine import Engine

    path = tmp_path / "odd-pre.gguf"
    write_tiny_gguf(path, TinySpec(num_layers=1, pre="no-such-pre"))
    with pytest.raises(ModelLoadError) as caught:
        Engine(EngineConfig(model_path=path, device="cpu", max_batch=1))
    message = str(caught.value)
    assert str(path) in message and "no-such-pre" in message and "\n" not in message


@given(st.lists(st.binary(max_size=12), max_size=40))
def test_packed_bytes_give_back_each_string(items: list[bytes]) -> None:
    packed = PackedBytes(items)
    assert len(packed) == len(items) and [packed[i] for i in range(len(items))] == items
    assert list(packed.lengths()) == [len(b) for b in items]
    with pytest.raises(IndexError):
        packed[len(items)]
