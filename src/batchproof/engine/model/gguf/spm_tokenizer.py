"""SentencePiece (`tokenizer.ggml.model = llama`) vocabularies as a `tokenizers` BPE, built the
way Hugging Face builds them from the same GGUF, so the ids agree; and each token's bytes.

A SentencePiece file carries tokens and scores but no merges. The merges are recovered from
the vocabulary: every token that splits into two tokens gives a merge, ranked by the token's
score (Gemma: by its place in the file, since its scores do not follow its merge order).
Text is spelled with "▁" for a space; a character with no token of its own falls back to its
UTF-8 bytes, the tokens `<0x00>`..`<0xFF>`.
"""

import re
from typing import Any

from tokenizers import AddedToken, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

SPACE = "\u2581"  # "▁", SentencePiece's spelling of a space
BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_BYTE = 3, 4, 6
# Architectures whose files rank merges by token order and spell space runs with real spaces.
GEMMA_ARCHS = frozenset({"gemma", "gemma2", "gemma3"})


def recover_merges(tokens: list[str], ranks: dict[str, float]) -> list[tuple[str, str]]:
    """Every (left, right) split of a token into two tokens, best-ranked token first; the
    splits of one token by longer left piece first (transformers' generate_merges; `ranks`
    is a dict as there, so a token spelled twice counts once, at its first place)."""
    ids = {token: i for i, token in enumerate(tokens)}
    merges = []
    for token, rank in ranks.items():
        for cut in range(len(token) - 1, 0, -1):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids:
                merges.append((-rank, -len(left), -len(right), left, right))
    merges.sort(key=lambda m: m[:3])  # stable: ties keep the vocabulary's order
    return [(m[3], m[4]) for m in merges]


def token_bytes(token: str, token_type: int) -> bytes:
    """The bytes a token stands for: <0xNN> is one byte, "▁" a space; control tokens their spelling."""
    match = BYTE_TOKEN.match(token)
    if token_type == TOKEN_BYTE and match:
        return bytes([int(match.group(1), 16)])
    if token_type == TOKEN_CONTROL:
        return token.encode("utf-8")
    return token.replace(SPACE, " ").encode("utf-8")


def build(metadata: dict[str, Any], tokens: list[str], types: list[int]) -> HFTokenizer:
    """The `tokenizers` tokenizer for a SentencePiece GGUF (control and user-defined tokens
    matched whole in the text, as llama.cpp and Hugging Face match them)."""
    arch = metadata.get("general.architecture")
    is_gemma = arch in GEMMA_ARCHS
    spelled = tokens
    if is_gemma:  # a run of spaces is stored as spaces; Hugging Face looks it up as "▁▁..."
        spelled = [SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
        ranks = {t: -i for i, t in enumerate(spelled)}
    else:
        ranks = dict(zip(tokens, (float(s) for s in metadata["tokenizer.ggml.scores"])))
    unk = metadata.get("tokenizer.ggml.unknown_token_id")
    vocab = {t: i for i, t in enumerate(spelled)}
    bpe = BPE(vocab=vocab, merges=recover_merges(spelled, ranks), fuse_unk=True, byte_fallback=True,
              unk_token=None if unk is None else spelled[int(unk)])
    hf = HFTokenizer(bpe)
    if is_gemma:  # GemmaTokenizer: spaces become "▁", no prefix space
        hf.normalizer = normalizers.Replace(" ", SPACE)
        hf.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    else:  # LlamaTokenizer: "▁" before the first word unless the file says not to
        prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
        hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first" if prefix else "never",
                                                    split=False)
    hf.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, kind in zip(tokens, types) if kind == TOKEN_CONTROL])
    hf.add_tokens([AddedToken(t, special=False, normalized=False)
                   for t, kind in zip(tokens, types) if kind == TOKEN_USER_DEFINED and t in vocab])
    return hf
