"""The tokenizer every model format gives: text <-> ids through a `tokenizers` model, with exact
per-token bytes and the special ids (each format builds one: model/gguf/, model/hf/)."""

import codecs
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from tokenizers import Tokenizer as HFTokenizer

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


@dataclass(frozen=True)
class SpecialIds:
    bos_id: int | None
    eos_id: int | None
    end_of_turn_ids: frozenset[int]
    add_bos: bool
    pad_id: int | None = None


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


class Tokenizer:
    """Text <-> ids, and each id's exact bytes."""

    def __init__(self, hf: HFTokenizer, tokens: list[str], token_bytes: list[bytes], special_ids: frozenset[int],
                 ids: SpecialIds) -> None:
        """Built by each format's reader (a GGUF's metadata: model/gguf/tokenizer.py; a Hugging
        Face checkpoint's tokenizer.json: model/hf/tokenizer.py): one spelling and one byte string
        per id, the ids that are special."""
        self.vocab_size, self._hf, self.special_ids = len(tokens), hf, special_ids
        self._spellings, self._bytes = _packed_spellings(tokens), PackedBytes(token_bytes)
        # The most text one token stands for (its bytes, or a special token's spelling): a text
        # longer than N of these has more than N tokens, known before tokenizing it.
        self.max_token_text_bytes = max(1, *self._bytes.lengths(), *(len(self._spellings[i]) for i in special_ids))
        self.ids = ids

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

    def serialized(self) -> str:
        """The `tokenizers` pipeline as that library writes it (normalizer, pre-tokenizer, model
        with its merges): what a receipt's tokenizer hash reads besides the ids' spellings and bytes."""
        return self._hf.to_str()

    def special_spellings(self) -> set[str]:
        """The spellings of the control and user-defined tokens (what a chat format is written in)."""
        return {self.spelling(i) for i in self.special_ids}


def _packed_spellings(tokens: list[str]) -> PackedBytes:
    # surrogatepass: a spelling is kept exactly, whatever the file holds
    return PackedBytes(t.encode("utf-8", errors="surrogatepass") for t in tokens)


def incremental_utf8_decoder() -> codecs.IncrementalDecoder:
    """Releases a character only once all its bytes have arrived."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace")
