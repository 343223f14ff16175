"""A GGUF's tokenizer, built from its metadata (byte-level BPE, or SentencePiece: spm_tokenizer.py)
as Hugging Face builds it from the same file, so the ids agree."""

from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from batchproof.engine.model.gguf import spm_tokenizer
from batchproof.engine.text.tokenizer import END_OF_TURN_SPELLINGS, SpecialIds, Tokenizer, bytes_to_unicode

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


# tokenizer.ggml.model -> how the tokenizer is built from the file
TOKENIZER_MODELS = {"gpt2": _byte_level, "llama": _sentencepiece}


def gguf_tokenizer(metadata: dict[str, Any]) -> Tokenizer:
    """Text <-> ids, and each id's exact bytes, from the file's tokenizer.ggml.* keys."""
    model = metadata.get("tokenizer.ggml.model")
    if model not in TOKENIZER_MODELS:
        raise ValueError(f"tokenizer.ggml.model {model!r} is not supported (supported: "
                         "'gpt2' byte-level BPE, 'llama' SentencePiece)")
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    types: list[int] = list(metadata.get("tokenizer.ggml.token_type", [TOKEN_NORMAL] * len(tokens)))
    hf, token_bytes = TOKENIZER_MODELS[model](metadata, tokens, types)
    special = frozenset(i for i, t in enumerate(types) if t in (TOKEN_CONTROL, TOKEN_USER_DEFINED))
    eos = metadata.get("tokenizer.ggml.eos_token_id")
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    declared = {metadata.get(k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                          "tokenizer.ggml.eom_token_id")} - {None}
    named = {i for i in special if tokens[i] in END_OF_TURN_SPELLINGS}
    ids = SpecialIds(
        bos_id=None if bos is None else int(bos),
        eos_id=None if eos is None else int(eos),
        end_of_turn_ids=frozenset(int(i) for i in declared | named),
        add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        pad_id=None if metadata.get("tokenizer.ggml.padding_token_id") is None
        else int(metadata["tokenizer.ggml.padding_token_id"]),
    )
    return Tokenizer(hf, tokens, token_bytes, special, ids)
