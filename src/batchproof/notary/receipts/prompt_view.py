"""What a reply shows of its scored prompt, read back number by number: vLLM's `prompt_logprobs`
(chat's beside the choices, a completion's on each choice), the prompt's entries that `echo`
puts first in the legacy logprobs, and `prompt_token_id_logprobs`. Each number is named in the
reply's terms and held to its re-executed counterpart, so a prompt logprob edited in a logged
reply is found at its prompt position, by which value, though the receipt beside it is intact."""

import functools
from collections.abc import Callable
from dataclasses import dataclass

from batchproof.common.log_add import log_add
from batchproof.common.wire import wire_logprob
from batchproof.notary.receipts.format import PromptEntry

ABSENT = "absent"  # what a re-executed entry has where the reply shows a number it does not hold


@dataclass(frozen=True)
class Shown:
    position: int  # the prompt position it scores (prompt_token_ids[position])
    field: str  # the reply's name for it: "prompt_logprobs[3]['1234'].logprob"
    what: str  # which value, in words
    value: object  # as the reply spells it
    expected: Callable[[PromptEntry], object]  # its counterpart in a re-executed entry, spelled the same way


def _rank(entry: PromptEntry, token_id: int) -> int | None:
    return next((r + 1 for r, (alt_id, _) in enumerate(entry[2]) if alt_id == token_id), None)


def _logprob_of(entry: PromptEntry, token_id: int, is_prompt_token: bool) -> object:
    if is_prompt_token:
        return wire_logprob(entry[1])
    rank = _rank(entry, token_id)
    return ABSENT if rank is None else wire_logprob(entry[2][rank - 1][1])


def vllm_rows(rows: list, prompt_ids: list[int], name: str) -> list[Shown]:
    """vLLM's `prompt_logprobs`: per position {id: {logprob, rank, decoded_token}}, the prompt's
    token first, then its alternatives; every id's logprob and rank are checked."""
    shown = []
    for position, row in enumerate(rows):
        if row is None or position >= len(prompt_ids):
            continue
        for key, value in row.items():
            token_id, is_token = int(key), int(key) == prompt_ids[position]
            field = f"{name}[{position}]['{key}']"
            who = f"prompt token {token_id}" if is_token else f"alternative {token_id}"
            shown.append(Shown(position, f"{field}.logprob", f"the logprob of {who}", value["logprob"],
                               lambda e, t=token_id, is_token=is_token: _logprob_of(e, t, is_token)))
            shown.append(Shown(position, f"{field}.rank", f"the rank of {who}", value["rank"],
                               lambda e, t=token_id: _rank(e, t)))
    return shown


def _token_id(key: str) -> int | None:
    return int(key.removeprefix("token_id:")) if key.startswith("token_id:") else None


def _joined_tail(entry: PromptEntry, top_n: int) -> float | None:
    if entry[3] is None:
        return None
    return wire_logprob(functools.reduce(log_add, (lp for _, lp in entry[2][top_n:]), entry[3]))


def _alternative(entry: PromptEntry, index: int, by_id: bool) -> object:
    if index >= len(entry[2]):
        return ABSENT
    alt_id, logprob = entry[2][index]
    return (alt_id, wire_logprob(logprob)) if by_id else wire_logprob(logprob)


def _by_text(entry: PromptEntry, index: int, top_n: int, num_shown: int, value: object) -> object:
    # Keyed by text, two alternatives of one spelling merge: then their places are not known,
    # and the shown value is taken as it is (as reply_view does for a completion's alternatives).
    return _alternative(entry, index, False) if num_shown == min(top_n, len(entry[2])) else value


def echoed(logprobs: dict, num_prompt: int, top_n: int) -> list[Shown]:
    """The prompt's legacy entries that `echo` put first (their alternatives keyed by text, or by
    id with return_tokens_as_token_ids), their tails joined with the alternatives not shown."""
    shown = []
    tails = logprobs.get("tail_logprobs")
    for position in range(1, num_prompt):
        where = f"logprobs.token_logprobs[{position}]"
        shown.append(Shown(position, where, "the prompt token's logprob", logprobs["token_logprobs"][position],
                           lambda e: wire_logprob(e[1])))
        top = logprobs["top_logprobs"][position] or {}
        num_shown = len(top)
        for index, (key, value) in enumerate(top.items()):
            token_id = _token_id(key)
            field = f"logprobs.top_logprobs[{position}][{key!r}]"
            if token_id is not None:
                shown.append(Shown(position, field, f"alternative {index + 1}'s id and logprob", (token_id, value),
                                   lambda e, i=index: _alternative(e, i, True)))
            else:
                shown.append(Shown(position, field, f"alternative {index + 1}'s logprob", value,
                                   lambda e, i=index, n=num_shown, v=value: _by_text(e, i, top_n, n, v)))
        if tails is not None:
            shown.append(Shown(position, f"logprobs.tail_logprobs[{position}]", "the tail's logprob", tails[position],
                               lambda e: _joined_tail(e, top_n)))
    return shown


def named(rows: list | None, start: int) -> list[Shown]:
    """`prompt_token_id_logprobs`: row i scores prompt position start + i + 1, by the named ids' order."""
    shown = []
    for i, row in enumerate(rows or []):
        position = start + 1 + i
        for j, value in enumerate(row):
            shown.append(Shown(position, f"prompt_token_id_logprobs[{i}][{j}]", f"named id {j}'s logprob", value,
                               lambda e, j=j: ABSENT if e[4] is None or j >= len(e[4]) else wire_logprob(e[4][j])))
    return shown


def first_difference(shown: list[Shown], computed: tuple[PromptEntry, ...]) -> tuple[Shown, object] | None:
    """The first number (by prompt position, then as the reply lists them) that is not the
    re-executed one, and that one; None when every one is equal."""
    for item in sorted(shown, key=lambda s: s.position):
        expected = item.expected(computed[item.position - 1]) if 1 <= item.position <= len(computed) else ABSENT
        if item.value != expected:
            return item, expected
    return None
