"""A request's grammar text as Lark: Lark (llguidance's dialect) as it is, llama.cpp's GBNF
converted, in time linear in the text.

llguidance's own `any_to_lark` tells the two apart with a multiline regex that is quadratic in
the number of lines and holds the GIL throughout (20,000 newlines: 5 s with the whole server
frozen), and its GBNF converter marks terminal rules by sweeping every rule until nothing
changes (a chain of 5,000 rules: 2.5 s). Here the same decisions are made in one pass each; the
converter's parser and printer are llguidance's own."""

from collections import deque

from llguidance import gbnf_to_lark as converter


def _is_word_char(c: str) -> bool:
    return c.isalnum() or c == "_"  # the regex's \w on text


def _starts_lark_line(text: str, at: int) -> bool:
    """Whether the line content from `at` (its first non-blank character) is `%llguidance` as a
    whole word, or `start` then blanks (newlines too, as the regex's \\s) then `:`."""
    if text.startswith("%llguidance", at):
        end = at + len("%llguidance")
        return end == len(text) or not _is_word_char(text[end])
    if text.startswith("start", at):
        end = at + len("start")
        while end < len(text) and text[end].isspace():
            end += 1
        return text.startswith(":", end)
    return False


def is_lark(text: str) -> bool:
    """llguidance's is_lark_syntax (`(?m)^\\s*(%llguidance\\b|start\\s*:)`), in one pass: some line,
    after blanks, begins with `%llguidance` or `start:`. The blanks skipped after a `start` stop at
    the next non-blank character, so no character is looked at more than twice."""
    at = 0
    while at < len(text):
        line_end = text.find("\n", at)
        line_end = len(text) if line_end == -1 else line_end
        first = at
        while first < line_end and text[first].isspace():
            first += 1
        if first < line_end and _starts_lark_line(text, first):
            return True
        at = line_end + 1
    return False


def _references(rule: converter.RuleNode) -> set[str]:
    """The names a rule's body refers to (iteratively: a deeply nested body is no recursion here)."""
    names: set[str] = set()
    pending: list[converter.ASTNode] = [rule.alternatives]
    while pending:
        node = pending.pop()
        if isinstance(node, converter.RuleRefNode):
            names.add(node.name)
        pending.extend(node.children())
    return names


def _mark_terminal_rules(rules: dict[str, converter.RuleNode]) -> None:
    """The rules llguidance's resolve() would mark terminal (every rule they refer to is terminal,
    `root` never), found by propagation from the rules that refer to none: each rule once, so its
    own sweep then finds nothing left to change."""
    references = {name: _references(rule) & rules.keys() for name, rule in rules.items()}
    referrers: dict[str, list[str]] = {name: [] for name in rules}
    for name, refs in references.items():
        for ref in refs:
            referrers[ref].append(name)
    num_open = {name: len(refs) for name, refs in references.items()}
    ready = deque(name for name, n in num_open.items() if n == 0 and name != "root")
    while ready:
        name = ready.popleft()
        rules[name].rule_is_terminal = True
        for referrer in referrers[name]:
            num_open[referrer] -= 1
            if num_open[referrer] == 0 and referrer != "root":
                ready.append(referrer)


def gbnf_to_lark(text: str) -> str:
    """llguidance's gbnf_to_lark with the terminal rules marked first (ValueError: not GBNF it
    can convert, RecursionError included: groups nested too deep)."""
    try:
        rules = converter.GrammarParser().parse(text)
        _mark_terminal_rules(rules)
        converter.resolve(rules)
        return _printed(sorted(rules.values(), key=lambda r: r.order))
    except RecursionError:
        raise ValueError("its groups are nested too deep") from None
    except Exception as e:  # GbnfToLarkError, or resolve()'s plain Exception: a missing or doubled rule
        raise ValueError(str(e)) from None


def _printed(rules: list[converter.RuleNode]) -> str:
    """The rules as llguidance's gbnf_to_lark prints them: a blank line around a multi-line rule."""
    lines = ["%llguidance {}\n\n"]
    prev_nl = True
    for rule in rules:
        s = str(rule)
        if not prev_nl and "\n" in s:
            lines.append("\n")
        lines.append(s + "\n")
        prev_nl = "\n" in s
        if prev_nl:
            lines.append("\n")
    return "".join(lines)


def to_lark(text: str) -> str:
    """The grammar as Lark (ValueError: GBNF that does not convert)."""
    return text if is_lark(text) else gbnf_to_lark(text)
