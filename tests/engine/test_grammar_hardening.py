"""Grammars a request can send, against the engine: Lark told from GBNF with llguidance's
decisions but not its quadratic regex, every unreadable grammar a GrammarError, each grammar
compiled once and copied per sequence, compiled only once its sequence runs, a queued compile
dropped on abort, a late mask or a grammar past llguidance's limits failing only its row, and
special tokens never allowed as text."""

import random
import threading

import llguidance.gbnf_to_lark as llguidance_gbnf
import pytest
from llguidance import LLMatcher, LLParserLimits, LLTokenizer, TokenizerWrapper

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.grammar import compile as grammars
from batchproof.engine.grammar import gbnf, matchers, state
from batchproof.engine.grammar.matchers import compiled_matchers
from batchproof.engine.grammar.state import GRAMMAR_WORKERS, GrammarState, unpack_mask
from batchproof.engine.grammar.vocabulary import _OurTokenizer, end_ids, grammar_tokenizer
from batchproof.engine.sampling.constraint import Constraint
from batchproof.engine.sampling.params import SamplingParams

# llama.cpp's grammars/json.gbnf: comments, multi-line rules, nested groups, repetition ranges.
JSON_GBNF = r'''
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in grammar
ws ::= | " " | "\n" [ \t]{0,20}
'''
GRAMMARS = [JSON_GBNF, 'root ::= "x" [a-c]{2}', 'start: "ab" NUM\nNUM: /[0-9]+/', '%llguidance {}\nstart: "a"',
            '  start \n : "a"', 'starts: "a"', "%llguidancex", "# c\n\t%llguidance", "\u00a0start:",
            'root ::= a-b\na-b ::= fooBar\nfooBar ::= "q" | root', 'root ::= a\na ::= "x" a | "y"\n', "", "x"]
UNREADABLE = ["", "x", "\n" * 20000, "::= ::= ((", "root ::= " + "(" * 5000 + '"x"' + ")" * 5000,
              'root ::= missing', 'root ::= "\\q"', "start: ((", "root ::= \"\ud800\""]


def _chain(num_rules: int) -> str:
    """root -> a0 -> a1 -> ... -> "x": llguidance's sweep marks one rule terminal per pass."""
    return "root ::= a0\n" + "".join(f"a{i} ::= a{i + 1}\n" for i in range(num_rules)) + f'a{num_rules} ::= "x"\n'


def _params(constraint: Constraint | None, max_tokens: int = 4, **fields) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, constraint=constraint, **{"temperature": 0.0, **fields})


def _lark(text: str) -> Constraint:
    return Constraint("grammar", LLMatcher.grammar_from_lark(text))


@pytest.fixture
def blocked_compiles(monkeypatch):
    """compile_matcher held until the test releases it, for grammars that contain "blocked";
    `calls` lists the grammars whose compile began."""
    release, calls = threading.Event(), []
    real = matchers.compile_matcher

    def held(tokenizer, grammar):
        if "blocked" in grammar:
            calls.append(grammar)
            release.wait(timeout=60)
        return real(tokenizer, grammar)

    monkeypatch.setattr(matchers, "compile_matcher", held)
    yield release, calls
    release.set()


# --- Lark or GBNF ------------------------------------------------------------------------------

def test_lark_or_gbnf_is_decided_as_llguidance_decides() -> None:
    rnd = random.Random(0)
    pieces = ["start", ":", " ", "\n", "%llguidance", "x", "\t", "\r", "_", "::=", '"a"', "root", "\x0b"]
    texts = GRAMMARS + ["".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 8))) for _ in range(5000)]
    for text in texts:
        assert gbnf.is_lark(text) == llguidance_gbnf.is_lark_syntax(text), repr(text)


@pytest.mark.parametrize("text", [g for g in GRAMMARS if not llguidance_gbnf.is_lark_syntax(g)] + [_chain(50)])
def test_gbnf_converts_to_llguidances_own_lark(text: str) -> None:
    try:
        expected = llguidance_gbnf.gbnf_to_lark(text)
    except Exception:
        with pytest.raises(ValueError):
            gbnf.gbnf_to_lark(text)
        return
    assert gbnf.gbnf_to_lark(text) == expected


def test_detection_never_runs_llguidances_regex(monkeypatch) -> None:
    def refused(text):
        raise AssertionError("llguidance's quadratic detector ran on request input")

    monkeypatch.setattr(llguidance_gbnf, "is_lark_syntax", refused)
    with pytest.raises(grammars.GrammarError, match="root"):
        grammars.grammar("\n" * 20000)
    assert grammars.grammar('start: "a"').kind == "grammar"


def test_a_chain_of_rules_is_resolved_in_linear_work(monkeypatch) -> None:
    """llguidance's sweep checks every rule once per pass and marks one per pass on a chain:
    2,000 rules are 2 million checks. Counted, not timed."""
    num_checks = 0
    real = llguidance_gbnf.RuleRefNode.is_terminal

    def counted(node):
        nonlocal num_checks
        num_checks += 1
        return real(node)

    monkeypatch.setattr(llguidance_gbnf.RuleRefNode, "is_terminal", counted)
    lark = grammars.grammar(_chain(2000)).grammar
    assert "A2000" in lark
    assert num_checks < 10 * 2000, num_checks


@pytest.mark.parametrize("text", UNREADABLE, ids=range(len(UNREADABLE)))
def test_every_unreadable_grammar_is_a_grammar_error(engine, text: str) -> None:
    with pytest.raises(grammars.GrammarError):
        grammars.check(grammars.grammar(text), engine.tokenizer)


def test_sizes_are_capped_before_any_parsing(monkeypatch) -> None:
    def refused(*args):
        raise AssertionError("parsed before its size was checked")

    monkeypatch.setattr(grammars, "to_lark", refused)
    with pytest.raises(grammars.GrammarError, match=str(grammars.MAX_GRAMMAR_CHARS)):
        grammars.grammar("x" * (grammars.MAX_GRAMMAR_CHARS + 1))
    with pytest.raises(grammars.GrammarError, match=str(grammars.MAX_REGEX_CHARS)):
        grammars.regex("a" * (grammars.MAX_REGEX_CHARS + 1))
    with pytest.raises(grammars.GrammarError, match=str(grammars.MAX_CHOICES)):
        grammars.choice(["a"] * (grammars.MAX_CHOICES + 1))
    with pytest.raises(grammars.GrammarError, match=str(grammars.MAX_CHOICE_CHARS)):
        grammars.choice(["a" * (grammars.MAX_CHOICE_CHARS // 2 + 1)] * 2)


# --- compiled once, when scheduled, dropped on abort ---------------------------------------------

def test_one_grammar_compiles_once_for_all_its_sequences(engine, monkeypatch) -> None:
    compiled = []
    real = matchers.compile_matcher
    monkeypatch.setattr(matchers, "compile_matcher", lambda tokenizer, grammar: compiled.append(grammar) or
                        real(tokenizer, grammar))
    constraint = grammars.regex("(once|twice) [a-z]{1,5}")
    ids = engine.chat_prompt_ids([{"role": "user", "content": "Say once or twice."}])
    outputs = engine.generate({f"r{i}": (ids, _params(constraint, seed=i, temperature=0.9)) for i in range(40)})
    assert compiled == [constraint.grammar]
    assert all(out[-1].finish_reason in ("stop", "length") for out in outputs.values())


def test_a_grammar_compiles_when_its_sequence_runs_not_while_it_waits(engine) -> None:
    constraint = grammars.regex("[a-z]{1,3}")
    ids = engine.chat_prompt_ids([{"role": "user", "content": "hi"}])
    num = engine.config.max_batch + 2
    for i in range(num):
        engine.add_request(f"q{i}", ids, _params(constraint))
    try:
        waiting = list(engine.scheduler.waiting)
        assert [seq.grammar.is_started for seq in waiting] == [False] * num
        engine.step()
        assert [seq.grammar.is_started for seq in waiting] == [True] * engine.config.max_batch + [False] * 2
    finally:
        for i in range(num):
            engine.abort(f"q{i}")
        while engine.has_work():
            engine.step()


def test_an_aborted_sequences_queued_compile_never_runs(blocked_compiles) -> None:
    """Every worker busy with a compile: a sequence admitted meanwhile (its prompt still being
    fed) and then aborted drops its compile; the workers are free again once theirs end."""
    release, calls = blocked_compiles
    engine = Engine(EngineConfig(device="cpu", max_batch=2, max_prefill_tokens=4))
    busy = [GrammarState(engine.tokenizer, _lark(f'start: "blocked{i}"').grammar) for i in range(GRAMMAR_WORKERS)]
    for one in busy:
        one.start()
    ids = engine.chat_prompt_ids([{"role": "user", "content": "A prompt fed over several prefill steps."}])
    engine.add_request("victim", ids, _params(_lark('start: "blocked victim"')))
    engine.step()  # admitted: its compile queued behind the busy workers; 4 prompt tokens fed
    (victim,) = engine.scheduler.running
    assert victim.grammar.is_started and victim.is_prefilling
    engine.abort("victim")
    assert victim.grammar.is_cancelled
    release.set()
    while engine.has_work():
        engine.step()
    assert [one.allowed(30).any().item() for one in busy] == [True] * GRAMMAR_WORKERS
    assert len(calls) == GRAMMAR_WORKERS and not any("victim" in grammar for grammar in calls)


# --- a row fails, the batch goes on --------------------------------------------------------------

def test_a_late_mask_fails_only_its_row(engine, monkeypatch, blocked_compiles) -> None:
    monkeypatch.setattr(engine.outputs, "grammar_mask_timeout_s", 0.2)
    ids = engine.chat_prompt_ids([{"role": "user", "content": "Name a colour."}])
    free, constrained = _params(None, max_tokens=6), _params(grammars.regex("[a-z]{2,8}"), max_tokens=6)
    alone = engine.generate({"free": (ids, free), "constrained": (ids, constrained)})
    together = engine.generate({"late": (ids, _params(_lark('start: "blocked late"'))), "free": (ids, free),
                                "constrained": (ids, constrained)})
    late = together["late"][-1]
    assert late.finish_reason == "error" and late.error_code == "grammar_timeout", late
    for request_id in ("free", "constrained"):
        assert [o.text for o in together[request_id]] == [o.text for o in alone[request_id]]
        assert together[request_id][-1].finish_reason == alone[request_id][-1].finish_reason


def test_a_grammar_past_llguidances_limits_mid_reply_fails_only_its_row(engine, monkeypatch) -> None:
    """Few Earley items allowed per mask: the grammar compiles and gives its first masks, then one
    step's mask needs more. That row ends with grammar_failed; the other row is untouched."""
    monkeypatch.setattr(matchers, "LIMITS", LLParserLimits(step_max_items=50))
    tight = _lark('start: /[a-z]+/ " " /[a-z0-9]{1,40}/ (" " /[a-z]{3,30}/)* "!fuel-test"')
    ids = engine.chat_prompt_ids([{"role": "user", "content": "Write some words."}])
    free = _params(None, max_tokens=8)
    alone = engine.generate({"free": (ids, free)})["free"]
    together = engine.generate({"tight": (ids, _params(tight, max_tokens=40, temperature=1.0, seed=5)),
                                "free": (ids, free)})
    failed = together["tight"][-1]
    assert failed.finish_reason == "error" and failed.error_code == "grammar_failed", failed
    assert "Too many items" in failed.error and "<state>" not in failed.error
    assert [o.text for o in together["free"]] == [o.text for o in alone]


# --- special tokens ------------------------------------------------------------------------------

def _special_ids_allowed_in_a_string(tokenizer, llt: LLTokenizer) -> set[int]:
    matcher = LLMatcher(llt, grammars.json_schema({"type": "string"}).grammar, log_level=0)
    assert matcher.consume_token(tokenizer.encode('"')[0]), matcher.get_error()
    allowed = unpack_mask(matcher.compute_bitmask(), tokenizer.vocab_size)
    assert allowed[tokenizer.encode("<")[0]]  # the mask is a string's: text like "<" is in it
    return {i for i in tokenizer.special_ids if allowed[i]}


def test_special_tokens_are_never_text_inside_a_json_string(engine) -> None:
    tokenizer = engine.tokenizer
    assert tokenizer.special_ids and _OurTokenizer(tokenizer).special_token_ids == sorted(tokenizer.special_ids)
    assert _special_ids_allowed_in_a_string(tokenizer, grammar_tokenizer(tokenizer)) == set()

    class NoSpecials(_OurTokenizer):  # what dropping special_token_ids would do: the test can fail
        def __init__(self, tokenizer) -> None:
            super().__init__(tokenizer)
            self.special_token_ids = []

    unguarded = LLTokenizer(TokenizerWrapper(NoSpecials(tokenizer)), n_vocab=tokenizer.vocab_size,
                            eos_token=end_ids(tokenizer))
    assert _special_ids_allowed_in_a_string(tokenizer, unguarded)


def test_the_check_fills_the_engines_cache(engine, monkeypatch) -> None:
    compiled = []
    real = matchers.compile_matcher
    monkeypatch.setattr(matchers, "compile_matcher", lambda tokenizer, grammar: compiled.append(grammar) or
                        real(tokenizer, grammar))
    constraint = grammars.regex("checked-once [0-9]")
    grammars.check(constraint, engine.tokenizer)
    held = compiled_matchers(engine.tokenizer).compiled(constraint.grammar)
    copy = compiled_matchers(engine.tokenizer).matcher(constraint.grammar)
    assert copy is not held and len(compiled) == 1
    assert copy.compute_bitmask() == held.deep_copy().compute_bitmask()
    assert state.GRAMMAR_WORKERS > 1
