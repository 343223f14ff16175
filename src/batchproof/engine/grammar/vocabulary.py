"""llguidance's view of our tokenizer: each id's exact bytes, as our detokenizer emits them, so
a token the mask allows is one whose text keeps the reply inside the grammar."""

import threading
import weakref

from llguidance import LLTokenizer, TokenizerWrapper

from batchproof.engine.text.tokenizer import Tokenizer

_built: "weakref.WeakKeyDictionary[Tokenizer, LLTokenizer]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class _OurTokenizer:
    """What llguidance's TokenizerWrapper reads: the bytes of every id, which ids are special
    (never matched as text: `<|im_start|>` inside a JSON string would be a control token), the
    end-of-turn id, and how text tokenizes (for the grammar's forced prefixes)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self.tokens = [tokenizer.decode_bytes(i) for i in range(tokenizer.vocab_size)]
        self.special_token_ids = sorted(tokenizer.special_ids)
        self.eos_token_id = min(end_ids(tokenizer))
        self.bos_token_id = tokenizer.ids.bos_id

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.encode(text)


def end_ids(tokenizer: Tokenizer) -> list[int]:
    """The ids that end a constrained reply once its grammar is complete (ValueError: none)."""
    ids = tokenizer.ids.end_of_turn_ids or ({tokenizer.ids.eos_id} - {None})
    if not ids:
        raise ValueError("this model's vocabulary has no end-of-turn or end-of-text token to end a constrained reply")
    return sorted(ids)


def grammar_tokenizer(tokenizer: Tokenizer) -> LLTokenizer:
    """Built once per tokenizer (0.3 s at 49,152 tokens, ~2 s at 262,144) and shared by every
    request: the mask's EOS bits are the model's end-of-turn ids, which end the reply."""
    with _lock:
        built = _built.get(tokenizer)
        if built is None:
            built = LLTokenizer(TokenizerWrapper(_OurTokenizer(tokenizer)), n_vocab=tokenizer.vocab_size,
                                eos_token=end_ids(tokenizer))
            _built[tokenizer] = built
        return built
