"""A Hugging Face checkpoint's tokenizer (tokenizer.json, read by the `tokenizers` library that
transformers itself runs, so the ids are transformers' ids), its special ids (tokenizer_config.json,
config.json, generation_config.json) and its chat template (chat_template.jinja or
tokenizer_config.json)."""

import json
import re
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from batchproof.engine.model.errors import ModelLoadError, shown
from batchproof.engine.model.hf.config import json_object
from batchproof.engine.text.tokenizer import END_OF_TURN_SPELLINGS, SpecialIds, Tokenizer, bytes_to_unicode

TOKENIZER_FILE = "tokenizer.json"
SPACE = "\u2581"  # SentencePiece's "▁"
BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _optional_json(path: Path) -> dict[str, Any]:
    """A JSON object file that may be absent ({}); present but unreadable is refused."""
    return json_object(path) if path.is_file() else {}


def _decoder_types(decoder: dict | None) -> set[str]:
    if not decoder:
        return set()
    inner = decoder.get("decoders") or []
    return {decoder.get("type"), *(d.get("type") for d in inner if isinstance(d, dict))}


def _token_bytes(spec: dict[str, Any], vocab: dict[str, int], added: dict[int, str], path: Path) -> dict[int, bytes]:
    """Each id's exact bytes: added tokens are their text; the others decoded as the decoder
    would decode them alone (byte-level's alphabet, or SentencePiece's "▁" and <0xNN>)."""
    kinds = _decoder_types(spec.get("decoder"))
    out: dict[int, bytes] = {i: text.encode("utf-8") for i, text in added.items()}
    if "ByteLevel" in kinds:
        to_byte = {char: byte for byte, char in bytes_to_unicode().items()}
        out |= {i: bytes(to_byte[c] for c in t if c in to_byte) for t, i in vocab.items() if i not in added}
    elif kinds & {"ByteFallback", "Replace", "Metaspace"}:
        has_bytes = bool((spec.get("model") or {}).get("byte_fallback"))
        for t, i in vocab.items():
            if i not in added:
                match = BYTE_TOKEN.match(t) if has_bytes else None
                out[i] = bytes([int(match.group(1), 16)]) if match else t.replace(SPACE, " ").encode("utf-8")
    else:
        raise ModelLoadError(f"{path}: decoder {shown(sorted(k for k in kinds if k))} is not supported "
                             "(byte-level BPE or SentencePiece-style)")
    return out


def _spelled(value: Any) -> str | None:
    """tokenizer_config's bos_token / eos_token: a string, or {"content": ...} in older files."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: Any) -> list[int]:
    """An id or a list of ids (generation_config's eos_token_id may be either)."""
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _adds_bos(spec: dict[str, Any], tok_config: dict[str, Any], bos_id: int | None) -> bool:
    """tokenizer_config's add_bos_token where it says; else whether the post-processor puts
    the BOS first, as transformers' tokenizer(text) would."""
    if isinstance(tok_config.get("add_bos_token"), bool):
        return tok_config["add_bos_token"]
    post = spec.get("post_processor") or {}
    steps = post.get("processors", [post]) if post.get("type") == "Sequence" else [post]
    for step in steps:
        if step.get("type") == "TemplateProcessing":
            first = (step.get("single") or [{}])[0]
            special = first.get("SpecialToken", {}).get("id")
            ids = (step.get("special_tokens") or {}).get(special, {}).get("ids", [])
            return special is not None and bos_id is not None and ids[:1] == [bos_id]
    return False


def checkpoint_tokenizer(directory: Path, config: dict[str, Any], vocab_rows: int) -> Tokenizer:
    """The tokenizer, one token per row of the embedding (rows past tokenizer.json's ids, as
    Qwen pads them, spell [PADn] and stand for no text, as in a converted GGUF)."""
    path = directory / TOKENIZER_FILE
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file (we tokenize with tokenizer.json; tokenizer.model or vocab.json "
                             "alone is not supported)")
    try:
        hf = HFTokenizer.from_file(str(path))
        spec = json.loads(path.read_text(encoding="utf-8"))
    except Exception as e:  # the library raises bare Exceptions for a malformed file
        raise ModelLoadError(f"{path}: not a tokenizer the tokenizers library reads ({e})") from None
    vocab = hf.get_vocab(with_added_tokens=True)
    if max(vocab.values(), default=-1) >= vocab_rows:
        raise ModelLoadError(f"{path}: token id {max(vocab.values())} is past the embedding's {vocab_rows} rows")
    added = {t["id"]: t["content"] for t in spec.get("added_tokens") or []}
    token_bytes = _token_bytes(spec, vocab, added, path)
    tokens = [f"[PAD{i}]" for i in range(vocab_rows)]
    for text, i in vocab.items():
        tokens[i] = added.get(i, text)
    special_ids = frozenset(t["id"] for t in spec.get("added_tokens") or [] if t.get("special"))
    tok_config = _optional_json(directory / "tokenizer_config.json")
    gen_config = _optional_json(directory / "generation_config.json")

    def token_id(key: str) -> int | None:
        spelled = _spelled(tok_config.get(key))
        if spelled is not None and spelled in vocab:
            return vocab[spelled]
        found = _ids(gen_config.get(f"{key}_id")) or _ids(config.get(f"{key}_id"))
        return found[0] if found and 0 <= found[0] < vocab_rows else None

    bos_id, eos_id = token_id("bos_token"), token_id("eos_token")
    declared = {eos_id, *_ids(gen_config.get("eos_token_id")), *_ids(config.get("eos_token_id"))} - {None}
    named = {i for i in special_ids if tokens[i] in END_OF_TURN_SPELLINGS}
    ids = SpecialIds(bos_id=bos_id, eos_id=eos_id,
                     end_of_turn_ids=frozenset(i for i in declared | named if 0 <= i < vocab_rows),
                     add_bos=_adds_bos(spec, tok_config, bos_id), pad_id=token_id("pad_token"))
    return Tokenizer(hf, tokens, [token_bytes.get(i, b"") for i in range(vocab_rows)], special_ids, ids)


def checkpoint_chat_template(directory: Path) -> tuple[str | None, str]:
    """(template, the file it came from): chat_template.jinja, else tokenizer_config.json's
    chat_template (a string, or a list of named templates of which "default" is the chat's);
    None if neither has one."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja.read_text(encoding="utf-8"), str(jinja)
        except (OSError, UnicodeDecodeError) as e:
            raise ModelLoadError(f"{jinja}: cannot read it ({e})") from None
    path = directory / "tokenizer_config.json"
    template = _optional_json(path).get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return (template, str(path)) if isinstance(template, str) and template else (None, "")
