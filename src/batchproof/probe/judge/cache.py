"""`--cache`: conversations that make a server's prompt cache hit, cold first, then warm, each warm
reply compared with the cold one of the same request."""

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from batchproof.probe.judge.pair import compare_replies, describe, finding, section_result
from batchproof.probe.records.message import Message
from batchproof.probe.records.reply import StreamResult

# Long enough to fill several cache blocks (ours are 16 tokens, vLLM's 16, SGLang's radix 1):
# about 170 tokens, so a hit is worth having and a cut can land inside a block.
SYSTEM_PROMPT = (
    "You are a patient technical writer. Answer in plain English, in full sentences, without lists "
    "or headings. Define each technical term the first time you use it. Prefer concrete examples "
    "to abstractions, and say what a reader should remember at the end of each paragraph. When a "
    "question has several parts, take them in the order they were asked. If something is uncertain "
    "or depends on the reader's situation, say so and explain what it depends on. Keep a friendly, "
    "calm tone, avoid jargon where an everyday word will do, and never pad an answer with "
    "repetition. Write for a reader who is curious and clever but new to the subject, and who will "
    "read every word you write."
)
OTHER_QUESTION = "Name three uses of a paperclip."
EARLIER_REPLY = "Here is a first, short answer; ask me to go on for the details."
NEXT_TURN = "Go on, with the details."
# Where the prefix-cut warmers end, as shares of the system prompt's characters: no block size
# divides both, so at least one cut lands inside a block on any server.
CUT_SHARES = (0.37, 0.71)


@dataclass(frozen=True)
class CacheCase:
    """A conversation fired cold (its nonce is new), then after `warmer`, which shares a long
    prefix with it, warm: alone and in bands."""

    name: str
    target: list[Message]
    warmer: list[Message]
    shared: str  # what the warmer shares, in words


def cache_cases(prompt: str, nonce: Callable[[], str] = lambda: secrets.token_hex(8)) -> list[CacheCase]:
    """The cases for one user prompt. Each starts with its own nonce, so its cold run shares no
    prefix with anything the server has seen, and everything after the nonce is shared with the
    warm runs."""
    cases = []

    def system(text: str = SYSTEM_PROMPT, key: str = "") -> Message:
        return {"role": "system", "content": f"Session {key}. {text}"}

    key = nonce()
    cases.append(CacheCase("system", [system(key=key), _user(prompt)], [system(key=key), _user(OTHER_QUESTION)],
                           "the system prompt"))
    key = nonce()
    turn_one = [system(key=key), _user(prompt)]
    turn_two = [*turn_one, {"role": "assistant", "content": EARLIER_REPLY}, _user(NEXT_TURN)]
    cases.append(CacheCase("turn", turn_two, turn_one, "the first turn (a multi-turn continuation)"))
    for share in CUT_SHARES:
        key, cut = nonce(), int(len(SYSTEM_PROMPT) * share)
        cases.append(CacheCase(
            f"cut-{cut}", [system(key=key), _user(prompt)],
            [system(SYSTEM_PROMPT[:cut] + " (abridged)", key), _user(OTHER_QUESTION)],
            f"the first {cut} characters of the system prompt"))
    return cases


def _user(text: str) -> Message:
    return {"role": "user", "content": text}


def _where(c: int, i: int) -> str:
    return f"warm alone #{i + 1}" if c == 1 else f"warm c={c} slot {i}"


def judge_case(
    case: CacheCase, cold: StreamResult, warmer: StreamResult, warm: Sequence[tuple[int, int, StreamResult]],
    n_predict: int, band_noise: Callable[[int], str | None],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One case's record and findings. A warm slot is blamed on the cache unless something else
    could explain it: two warm alone runs that differ from each other (the server is not
    deterministic alone), for a band, `band_noise(c)` (its plain band already differs from m=1), or
    a slot the server says the cache served no more of than the cold run (llama-server with
    `cache_prompt: false` reports 0 and still parts from the cold run inside a band of long prompts)."""
    diffs = [(c, i, r, compare_replies(cold, r, n_predict)) for c, i, r in warm]
    alone = [r for c, _, r in warm if c == 1]
    noise = None
    if len(alone) >= 2 and compare_replies(alone[0], alone[1], n_predict).kind not in (None, "refused"):
        noise = "two warm alone runs differ from each other"
    slots, findings = [], []
    for c, i, result, diff in diffs:
        why_not = noise or (band_noise(c) if c > 1 else None) or _no_new_hit(result, cold)
        slots.append({"c": c, "i": i, "cached_tokens": result.cached_tokens, **diff.record(),
                      "attributable": why_not is None, "not_attributable": why_not})
        if diff.kind is not None:
            hit = "cached_tokens unknown" if result.cached_tokens is None else f"{result.cached_tokens} cached tokens"
            text = f"cache: case {case.name}, {_where(c, i)} ({hit}): {describe(diff, 'the cold run')}"
            if why_not is not None:
                text += f" (not attributable to the cache: {why_not})"
            findings.append(finding(diff.kind, text, why_not is None))
    record = {"case": case.name, "shares": case.shared,
              "cold": _run(cold), "warmer": _run(warmer), "slots": slots}
    return record, findings


def _no_new_hit(warm: StreamResult, cold: StreamResult) -> str | None:
    """Why a warm slot's difference is not the cache's: it reports no more cached tokens than the cold run."""
    if warm.cached_tokens is None or cold.cached_tokens is None or warm.cached_tokens > cold.cached_tokens:
        return None
    return (f"it reports {warm.cached_tokens} cached tokens, no more than the cold run's {cold.cached_tokens}: "
            "the cache served it nothing the cold run lacked")


def _run(result: StreamResult) -> dict[str, Any]:
    return {"cached_tokens": result.cached_tokens, "completion_tokens": result.completion_tokens,
            "refused": result.error}


def cache_record(cases: list[tuple[dict[str, Any], list[dict[str, Any]]]]) -> dict[str, Any]:
    """The witness's `cache` section: every case, every finding, the verdict."""
    findings = [f for _, found in cases for f in found]
    result, reason = section_result(findings)
    slots = [s for record, _ in cases for s in record["slots"]]
    hits = [s["cached_tokens"] for s in slots if s["cached_tokens"] is not None]
    return {"result": result, "reason": reason, "findings": findings,
            "num_warm_slots": len(slots), "num_hits": sum(1 for n in hits if n > 0) if hits else None,
            "cases": [record for record, _ in cases]}


async def measure_case(
    case: CacheCase, fire: Callable[[list[Message]], Awaitable[StreamResult]], ladder: Sequence[int],
) -> tuple[StreamResult, StreamResult, list[tuple[int, int, StreamResult]]]:
    """Cold, warmer, two warm alone runs, then a warm band per rung above 1: (cold, warmer, warm slots)."""
    cold = await fire(case.target)
    warmer = await fire(case.warmer)
    warm = [(1, 0, await fire(case.target)), (1, 1, await fire(case.target))]
    for c in ladder:
        if c > 1:
            results = await asyncio.gather(*(fire(case.target) for _ in range(c)))
            warm += [(c, i, r) for i, r in enumerate(results)]
    return cold, warmer, warm
