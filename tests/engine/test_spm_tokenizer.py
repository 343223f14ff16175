"""SentencePiece (`llama`-model) vocabularies, the Llama 2 / TinyLlama / Mistral kind: ids equal
Hugging Face's for the same GGUF, and each token's exact bytes. (Gemma's vocabulary, the same
code with Gemma's two differences, is checked on the real model in test_gemma3_270m.py.)"""

from pathlib import Path

import pytest

from batchproof.engine.model.gguf.reader import read_gguf
from batchproof.engine.model.gguf.tokenizer import gguf_tokenizer
from batchproof.engine.text.tokenizer import Tokenizer
from tests.helpers.tiny_spm import write_tiny_spm_gguf

# transformers 5.24's AutoTokenizer.from_pretrained(dir, gguf_file=...) on write_tiny_spm_gguf's
# file, encode(text, add_special_tokens=False).
HF_IDS = {
    "hello world": [281, 286],
    "the and": [277, 289],
    " the and": [277, 289],
    "Héllo wörld 123": [259, 75, 274, 279, 283, 198, 185, 266, 285, 259, 290, 273],
    "emoji 🎉!": [259, 262, 112, 264, 109, 108, 259, 243, 162, 145, 140, 36],
    "  two  spaces    four": [259, 276, 265, 264, 291, 270, 115, 268, 102, 262, 270, 292, 105, 264, 120, 266],
    "<s>x</s>": [1, 123, 2],
    "<|tool|>call the world": [294, 102, 268, 278, 277, 286],
    "": [],
    "\n\ttab": [259, 13, 12, 260, 268, 101],
    "hellohello worldworld": [281, 275, 279, 286, 265, 282, 285],
    "1231 212": [259, 290, 273, 271, 259, 272, 290],
}


def tokenizer(tmp_path: Path, add_space_prefix: bool = True) -> Tokenizer:
    path = tmp_path / f"spm-{add_space_prefix}.gguf"
    write_tiny_spm_gguf(path, add_space_prefix)
    return gguf_tokenizer(read_gguf(path)[0])


@pytest.fixture(scope="module")
def spm(tmp_path_factory) -> Tokenizer:
    return tokenizer(tmp_path_factory.mktemp("spm"))


@pytest.mark.parametrize("text", list(HF_IDS))
def test_ids_equal_hugging_faces(spm: Tokenizer, text: str) -> None:
    assert spm.encode(text) == HF_IDS[text]


def test_each_token_has_its_exact_bytes(spm: Tokenizer) -> None:
    ids = spm.encode("Héllo wörld 🎉")  # byte-fallback pieces carry one byte each
    assert b"".join(spm.decode_bytes(i) for i in ids) == " Héllo wörld 🎉".encode()
    assert spm.decode_bytes(spm.encode("hello")[0]) == b" hello"  # "▁" is the space byte
    assert spm.decode_bytes(3 + 0xF0) == b"\xf0"  # <0xF0>
    assert spm.decode_bytes(1) == b"<s>"  # control tokens: their spelling
    assert spm.encode("x", add_bos=True) == [1, 259, 123] and spm.ids.add_bos  # BOS, "▁", <0x78>


def test_add_space_prefix_false_adds_no_space(tmp_path: Path) -> None:
    plain = tokenizer(tmp_path, add_space_prefix=False)
    ids = plain.encode("hello world")
    assert b"".join(plain.decode_bytes(i) for i in ids) == b"hello world"
    assert ids[-1] == HF_IDS["hello world"][-1] and ids[0] != HF_IDS["hello world"][0]
