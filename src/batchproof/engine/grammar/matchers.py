"""Each grammar compiled once per tokenizer: the server's check compiles it, every sequence that
runs it gets a copy of that matcher (a 16-prompt request with n=16 compiles its schema once, not
256 times, and the copy costs microseconds where the compile cost up to a second)."""

import hashlib
import threading
import weakref
from collections import OrderedDict
from concurrent.futures import Future

from llguidance import LLMatcher, LLParserLimits

from batchproof.engine.grammar.vocabulary import grammar_tokenizer
from batchproof.engine.text.tokenizer import Tokenizer

# llguidance's default bounds on a grammar's size and on the work of one step's mask: the same
# for the check and the engine, so what passes the check runs.
LIMITS = LLParserLimits()
# Compiled matchers kept per tokenizer: enough for the distinct grammars of the requests in
# flight between their check and their scheduling (a big schema's matcher holds a few MB).
MAX_COMPILED = 32


class CompileError(ValueError):
    """The grammar does not compile (llguidance's message, which quotes only the grammar)."""


def compile_matcher(tokenizer: Tokenizer, grammar: str) -> LLMatcher:
    """A fresh matcher (CompileError: llguidance refused the grammar)."""
    try:
        matcher = LLMatcher(grammar_tokenizer(tokenizer), grammar, log_level=0, limits=LIMITS)
    except ValueError as e:  # no end-of-turn id (grammar_tokenizer), or a grammar the constructor refused
        raise CompileError(str(e).strip()) from None
    if matcher.is_error():
        raise CompileError(matcher.get_error().strip())
    return matcher


class CompiledMatchers:
    """One tokenizer's compiled grammars, least recently used first out, keyed by the grammar
    text's sha256. Two threads asking for the same new grammar compile it once: the second
    waits for the first's compile (which waits on nothing, so no wait can be circular)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = weakref.ref(tokenizer)
        self._lock = threading.Lock()
        self._compiled: OrderedDict[bytes, Future[LLMatcher]] = OrderedDict()

    def matcher(self, grammar: str) -> LLMatcher:
        """A matcher of its own for one sequence, at the grammar's start (CompileError)."""
        return self.compiled(grammar).deep_copy()

    def compiled(self, grammar: str) -> LLMatcher:
        """The shared, never advanced matcher of `grammar`, compiled if it is not held."""
        key = hashlib.sha256(grammar.encode("utf-8", errors="surrogatepass")).digest()
        with self._lock:
            entry = self._compiled.get(key)
            is_owner = entry is None
            if is_owner:
                entry = self._compiled[key] = Future()
                while len(self._compiled) > MAX_COMPILED:
                    self._compiled.popitem(last=False)
            else:
                self._compiled.move_to_end(key)
        if is_owner:
            try:
                entry.set_result(compile_matcher(self._tokenizer(), grammar))
            except BaseException as e:  # not kept: the next request with this text tries again
                with self._lock:
                    if self._compiled.get(key) is entry:
                        del self._compiled[key]
                entry.set_exception(e)
        return entry.result()


_held: "weakref.WeakKeyDictionary[Tokenizer, CompiledMatchers]" = weakref.WeakKeyDictionary()
_held_lock = threading.Lock()


def compiled_matchers(tokenizer: Tokenizer) -> CompiledMatchers:
    """The tokenizer's compiled grammars, shared by the server's check and the engine (as its
    LLTokenizer is, by grammar_tokenizer)."""
    with _held_lock:
        held = _held.get(tokenizer)
        if held is None:
            held = _held[tokenizer] = CompiledMatchers(tokenizer)
        return held
