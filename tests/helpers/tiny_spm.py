"""A tiny SentencePiece (`tokenizer.ggml.model = llama`) vocabulary in a GGUF, as llama.cpp's
converter writes Llama 2 / TinyLlama / Mistral files: control tokens, 256 byte-fallback tokens,
scored pieces spelled with "▁", a user-defined token. Metadata only (no tensors)."""

from pathlib import Path

import gguf

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_BYTE = 1, 2, 3, 4, 6
# (piece, score): a higher score merges first, as in SentencePiece's BPE
PIECES = [
    ("▁", -1.0), ("t", -2.0), ("h", -3.0), ("e", -4.0), ("l", -5.0), ("o", -6.0), ("w", -7.0), ("r", -8.0),
    ("d", -9.0), ("a", -10.0), ("n", -11.0), ("s", -12.0), ("1", -13.0), ("2", -14.0), ("3", -15.0), ("é", -16.0),
    ("he", -20.0), ("▁t", -21.0), ("▁the", -22.0), ("ll", -23.0), ("llo", -24.0), ("▁he", -30.0),
    ("▁hello", -25.0), ("or", -26.0), ("▁w", -27.0), ("▁wor", -28.0), ("ld", -29.0), ("▁world", -31.0),
    ("an", -32.0), ("▁an", -33.0), ("▁and", -34.0), ("12", -35.0), ("▁▁", -36.0), ("▁▁▁▁", -37.0), ("th", -38.0),
]
USER_DEFINED = ["<|tool|>"]


def vocab() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"]
    scores = [0.0, 0.0, 0.0]
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    scores += [0.0] * 256
    types += [TOKEN_BYTE] * 256
    tokens += [p for p, _ in PIECES] + USER_DEFINED
    scores += [s for _, s in PIECES] + [0.0] * len(USER_DEFINED)
    types += [TOKEN_NORMAL] * len(PIECES) + [TOKEN_USER_DEFINED] * len(USER_DEFINED)
    return tokens, scores, types


def write_tiny_spm_gguf(path: Path, add_space_prefix: bool = True) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    add_tokenizer(writer, add_space_prefix)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def add_tokenizer(writer: gguf.GGUFWriter, add_space_prefix: bool = True) -> None:
    """The vocabulary's metadata, into a writer (tiny_gguf's models take it with tokenizer="llama")."""
    tokens, scores, types = vocab()
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(add_space_prefix)
