"""The tokenizer, built from GGUF metadata (byte-level BPE or SentencePiece), with exact per-token bytes."""

import codecs
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from batchproof.engine import spm_tokenizer

# GGUF token_type values (llama.cpp's llama_token_type).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# tokenizer.ggml.pre -> how text is split before BPE, as Hugging Face's tokenizer.json
# for that family does it: ("digits",) splits every digit, ("split", regex) isolates
# regex matches, ("gpt2",) is GPT-2's own regex inside the byte-level step.
PRE_TOKENIZER_STEPS: dict[str, tuple[tuple[str, ...], ...]] = {
    "default": (("gpt2",),),
    "gpt2": (("gpt2",),),
    "smollm": (("digits",), ("gpt2",)),
    "starcoder": (("digits",), ("gpt2",)),
    "llama-bpe": (("split", LLAMA3_PATTERN),),
    "llama3": (("split", LLAMA3_PATTERN),),
    "qwen2": (("split", QWEN2_PATTERN),),
}
IGNORE_MERGES_PRE = {"llama-bpe", "llama3"}

# Spellings that end a turn in the chat formats we know, besides the declared eos/eot.
END_OF_TURN_SPELLINGS = {
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|end|>", "<end_of_turn>",
}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte (byte-level BPE spells tokens in these)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def _pre_tokenizer(pre: str) -> Any:
    steps = PRE_TOKENIZER_STEPS.get(pre)
    if steps is None:
        raise ValueError(f"tokenizer.ggml.pre {pre!r} is not supported (supported: {', '.join(PRE_TOKENIZER_STEPS)})")
    parts = []
    for step in steps:
        if step[0] == "digits":
            parts.append(pre_tokenizers.Digits(individual_digits=True))
        elif step[0] == "split":
            parts.append(pre_tokenizers.Split(Regex(step[1]), behavior="isolated", invert=False))
    uses_gpt2_regex = any(step[0] == "gpt2" for step in steps)
    parts.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=uses_gpt2_regex))
    return pre_tokenizers.Sequence(parts)


@dataclass(frozen=True)
class SpecialIds:
    bos_id: int | None
    eos_id: int | None
    end_of_turn_ids: frozenset[int]
    add_bos: bool
    pad_id: int | None = None


def _byte_level(metadata: dict[str, Any], tokens: list[str], types: list[int]) -> tuple[HFTokenizer, list[bytes]]:
    """Byte-level BPE (`gpt2`): tokens spelled in GPT-2's byte alphabet, merges in the file."""
    merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    pre = metadata.get("tokenizer.ggml.pre", "default")
    bpe = models.BPE(
        vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
        ignore_merges=pre in IGNORE_MERGES_PRE,
    )
    hf = HFTokenizer(bpe)
    hf.pre_tokenizer = _pre_tokenizer(pre)
    hf.decoder = decoders.ByteLevel()
    special = {i for i, t in enumerate(types) if t in (TOKEN_CONTROL, TOKEN_USER_DEFINED)}
    hf.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in sorted(special)])
    to_byte = {char: byte for byte, char in bytes_to_unicode().items()}
    token_bytes = [t.encode("utf-8") if i in special else bytes(to_byte[c] for c in t if c in to_byte)
                   for i, t in enumerate(tokens)]
    return hf, token_bytes


def _sentencepiece(metadata: dict[str, Any], tokens: list[str], types: list[int]) -> tuple[HFTokenizer, list[bytes]]:
    """SentencePiece (`llama`): scores, "▁" for a space, byte fallback (spm_tokenizer.py)."""
    token_bytes = [spm_tokenizer.token_bytes(t, kind) for t, kind in zip(tokens, types)]
    return spm_tokenizer.build(metadata, tokens, types), token_bytes


class PackedBytes:
    """Byte strings, one per id, in one buffer: Gemma 3's 262,144 token spellings and byte strings
    as Python lists held 38 MB (an object per string); packed, 4 MB."""

    def __init__(self, items: Iterable[bytes]) -> None:
        items = list(items)
        self._blob = b"".join(items)
        self._ends = array("q", [0])
        total = 0
        for item in items:
            total += len(item)
            self._ends.append(total)

    def __len__(self) -> int:
        return len(self._ends) - 1

    def __getitem__(self, i: int) -> bytes:
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._blob[self._ends[i]:self._ends[i + 1]]

    def lengths(self) -> Iterable[int]:
        return (self._ends[i + 1] - self._ends[i] for i in range(len(self)))


# tokenizer.ggml.model -> how the tokenizer is built from the file
TOKENIZER_MODELS = {"gpt2": _byte_level, "llama": _sentencepiece}


class Tokenizer:
    """Text <-> ids, and each id's exact bytes."""

    def __init__(self, metadata: dict[str, Any]) -> None:
        model = metadata.get("tokenizer.ggml.model")
        if model not in TOKENIZER_MODELS:
            raise ValueError(f"tokenizer.ggml.model {model!r} is not supported (supported: "
                             "'gpt2' byte-level BPE, 'llama' SentencePiece)")
        tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
        types: list[int] = list(metadata.get("tokenizer.ggml.token_type", [TOKEN_NORMAL] * len(tokens)))
        hf, token_bytes = TOKENIZER_MODELS[model](metadata, tokens, types)
        special = frozenset(i for i, t in enumerate(types) if t in (TOKEN_CONTROL, TOKEN_USER_DEFINED))
        self._set_vocabulary(hf, tokens, token_bytes, special)
        eos = metadata.get("tokenizer.ggml.eos_token_id")
        bos = metadata.get("tokenizer.ggml.bos_token_id")
        declared = {metadata.get(k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                              "tokenizer.ggml.eom_token_id")} - {None}
        named = {i for i in special if tokens[i] in END_OF_TURN_SPELLINGS}
        self.ids = SpecialIds(
            bos_id=None if bos is None else int(bos),
            eos_id=None if eos is None else int(eos),
            end_of_turn_ids=frozenset(int(i) for i in declared | named),
            add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
            pad_id=None if metadata.get("tokenizer.ggml.padding_token_id") is None
            else int(metadata["tokenizer.ggml.padding_token_id"]),
        )

    @classmethod
    def from_parts(cls, hf: HFTokenizer, tokens: list[str], token_bytes: list[bytes], special_ids: frozenset[int],
                   ids: SpecialIds) -> "Tokenizer":
        """A tokenizer built elsewhere (a Hugging Face checkpoint's tokenizer.json: hf_tokenizer.py):
        one spelling and one byte string per id, the ids that are special."""
        tokenizer = cls.__new__(cls)
        tokenizer._set_vocabulary(hf, tokens, token_bytes, special_ids)
        tokenizer.ids = ids
        return tokenizer

    def _set_vocabulary(self, hf: HFTokenizer, tokens: list[str], token_bytes: list[bytes],
                        special_ids: frozenset[int]) -> None:
        self.vocab_size, self._hf, self.special_ids = len(tokens), hf, special_ids
        self._spellings, self._bytes = _packed_spellings(tokens), PackedBytes(token_bytes)
        # The most text one token stands for (its bytes, or a special token's spelling): a text
        # longer than N of these has more than N tokens, known before tokenizing it.
        self.max_token_text_bytes = max(1, *self._bytes.lengths(), *(len(self._spellings[i]) for i in special_ids))

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Special-token spellings in `text` become their ids, as in a chat template's output."""
        # encode_batch, not encode: it releases the GIL while it works (encode holds it: 1.6 s
        # for 2 MB of text, in which no other thread, the server's event loop included, ran).
        ids = self._hf.encode_batch([text], add_special_tokens=False)[0].ids
        if add_bos and self.ids.bos_id is not None:
            ids = [self.ids.bos_id, *ids]
        return ids

    def min_num_tokens(self, text: str) -> int:
        """A lower bound on len(encode(text)), without tokenizing (UTF-8 bytes / the longest token)."""
        return -(-len(text.encode("utf-8", errors="surrogatepass")) // self.max_token_text_bytes)

    def decode_bytes(self, token_id: int) -> bytes:
        return self._bytes[token_id]

    def decode(self, token_ids: list[int]) -> str:
        return b"".join(self._bytes[i] for i in token_ids).decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        """The token's bytes read as UTF-8, a broken sequence shown as U+FFFD."""
        return self._bytes[token_id].decode("utf-8", errors="replace")

    def spelling(self, token_id: int) -> str:
        return self._spellings[token_id].decode("utf-8", errors="surrogatepass")

    def special_spellings(self) -> set[str]:
        """The spellings of the control and user-defined tokens (what a chat format is written in)."""
        return {self.spelling(i) for i in self.special_ids}


def _packed_spellings(tokens: list[str]) -> PackedBytes:
    # surrogatepass: a spelling is kept exactly, whatever the file holds
    return PackedBytes(t.encode("utf-8", errors="surrogatepass") for t in tokens)


def incremental_utf8_decoder() -> codecs.IncrementalDecoder:
    """Releases a character only once all its bytes have arrived."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace")
