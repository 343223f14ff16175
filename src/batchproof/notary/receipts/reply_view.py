"""What a reply shows beside its receipts, read back from its JSON: each token's logprob, its
alternatives' and its tail, as the wire spells them, and the token ids where it returned them.
The verifier holds these to what it re-executed, so a logprob edited in a logged reply is found
at its position even though the receipt beside it is intact."""

from dataclasses import dataclass

from batchproof.common.wire import wire_logprob
from batchproof.notary.receipts import prompt_view
from batchproof.notary.receipts.format import Entry
from batchproof.notary.receipts.prompt_view import Shown

# (logprob, the alternatives' logprobs best first or None where the reply's shape lost some,
# the tail's logprob or None): one token's numbers as the reply spells them.
WireEntry = tuple[float, tuple[float, ...] | None, float | None]


@dataclass(frozen=True)
class ReplyView:
    entries: list[WireEntry] | None  # one per reply token, then the end token's where shown
    token_ids: list[int] | None  # the generated ids, the end token last (return_token_ids)
    shows_end: bool = True  # whether an end token's entry is shown (the Responses API has no place for it)
    prompt: list[Shown] | None = None  # each number it shows of its scored prompt (prompt_view.py)


def _chat_entry(entry: dict) -> WireEntry:
    return (entry["logprob"], tuple(alt["logprob"] for alt in entry.get("top_logprobs") or []),
            entry.get("tail_logprob"))


def chat_view(choice: dict, reply: dict, prompt_ids: list[int]) -> ReplyView:
    """A chat.completion choice (its `logprobs.content`, then its `end_token`), and the prompt's
    scores the reply carries beside its choices (`prompt_logprobs`, one prompt for all)."""
    content = (choice.get("logprobs") or {}).get("content")
    entries = None
    if content is not None:
        entries = [_chat_entry(e) for e in content]
        if choice.get("end_token") is not None:
            entries.append(_chat_entry(choice["end_token"]))
    rows = reply.get("prompt_logprobs")
    prompt = None if rows is None else prompt_view.vllm_rows(rows, prompt_ids, "prompt_logprobs")
    return ReplyView(entries, choice.get("token_ids"), prompt=prompt)


def _completions_prompt(choice: dict, prompt_ids: list[int], num_tokens: int, num_alternatives: int | None,
                        start: int) -> list[Shown] | None:
    """Every number a completion choice shows of its prompt: vLLM's prompt_logprobs, the entries
    echo put first, the named ids' rows."""
    shown: list[Shown] = []
    if choice.get("prompt_logprobs") is not None:
        shown += prompt_view.vllm_rows(choice["prompt_logprobs"], prompt_ids, "prompt_logprobs")
    logprobs = choice.get("logprobs")
    if logprobs is not None and len(logprobs["token_logprobs"]) == len(prompt_ids) + num_tokens:  # echoed
        shown += prompt_view.echoed(logprobs, len(prompt_ids), num_alternatives or 0)
    if choice.get("prompt_token_id_logprobs") is not None:
        shown += prompt_view.named(choice["prompt_token_id_logprobs"], start)
    return shown or None


def completions_view(choice: dict, num_tokens: int, num_alternatives: int | None, prompt_ids: list[int],
                     start: int = 0) -> ReplyView:
    """A text_completion choice: its last num_tokens legacy entries (with echo the prompt's come
    first), then its `end_token`. A top_logprobs object keyed by text merges two alternatives of
    one spelling; then its alternatives are not compared (None)."""
    logprobs = choice.get("logprobs")
    entries = None
    if logprobs is not None:
        values = logprobs["token_logprobs"][len(logprobs["token_logprobs"]) - num_tokens:]
        tops = logprobs["top_logprobs"][len(logprobs["top_logprobs"]) - num_tokens:]
        tails = (logprobs.get("tail_logprobs") or [None] * len(logprobs["token_logprobs"]))
        tails = tails[len(tails) - num_tokens:]
        entries = []
        for value, top, tail in zip(values, tops, tails):
            alternatives = tuple(top.values()) if top is not None and len(top) == num_alternatives else None
            entries.append((value, alternatives, tail))
        if choice.get("end_token") is not None:
            entries.append(_chat_entry(choice["end_token"]))
    return ReplyView(entries, choice.get("token_ids"),
                     prompt=_completions_prompt(choice, prompt_ids, num_tokens, num_alternatives, start))


def responses_view(response: dict) -> ReplyView:
    """A Responses `response`: the entries of its output items in order (a message's text, a
    call's arguments); it carries no token ids and no end token."""
    entries: list[WireEntry] = []
    found = False
    for item in response.get("output") or []:
        parts = (item.get("content") or []) if item.get("type") == "message" else [item]
        for part in parts:
            if part.get("logprobs") is not None:
                found = True
                entries += [_chat_entry(e) for e in part["logprobs"]]
    return ReplyView(entries if found else None, None, shows_end=False)


def wire_entries(entries: tuple[Entry, ...]) -> list[WireEntry]:
    """Re-executed entries, spelled as a reply spells them (-inf as -9999)."""
    return [(wire_logprob(logprob), tuple(wire_logprob(lp) for _, lp in top),
             None if tail is None else wire_logprob(tail)) for _, logprob, top, tail in entries]


def first_difference(shown: list[WireEntry], computed: list[WireEntry]) -> int | None:
    """The first position where the reply's numbers are not the re-executed ones (alternatives
    the reply's shape could not keep apart are skipped); None when every one is equal."""
    for position, (mine, theirs) in enumerate(zip(shown, computed)):
        same_alternatives = mine[1] is None or mine[1] == theirs[1]
        if mine[0] != theirs[0] or not same_alternatives or mine[2] != theirs[2]:
            return position
    return None if len(shown) == len(computed) else min(len(shown), len(computed))
