"""A fleet's cross-replica agreement: which replica served what, whether the replicas' m=1
replies of one prompt are bitwise equal, and the fleet's verdict (pure functions)."""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from batchproof.common.band import Band
from batchproof.probe.judge.logprob_parity import compare
from batchproof.probe.judge.verdict import Result, agreement, intern
from batchproof.probe.records.entry import Entry

# Alone requests per replica the fleet's m=1 phase may spend finding every replica twice:
# a router that picks at random reaches each of 2 replicas twice within 16 requests in all
# but about 1 run in 1,900 (2 * 17 / 2**16).
ALONE_PER_REPLICA = 8


@dataclass(frozen=True)
class Listed:
    """One replica as the fleet's /v1/server_info lists it."""

    id: str
    is_alive: bool
    numerics_id: str | None


def listed_replicas(info: Any) -> list[Listed] | None:
    """The replicas under `fleet.replicas` of /v1/server_info; [] for a server_info without
    them (a single server, or another kind); None when the server had no server_info."""
    if not isinstance(info, dict):
        return None
    fleet = info.get("fleet")
    entries = fleet.get("replicas") if isinstance(fleet, dict) else None
    if not isinstance(entries, list):
        return []
    listed = []
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            numerics = entry.get("numerics_id")
            listed.append(Listed(entry["id"], entry.get("alive") is not False,
                                 numerics if isinstance(numerics, str) else None))
    return listed


def alive_ids(listed: Sequence[Listed] | None) -> list[str]:
    return [r.id for r in listed or () if r.is_alive]


def alone_cap(listed: Sequence[Listed] | None) -> int:
    return ALONE_PER_REPLICA * max(2, len(alive_ids(listed)))


def needs_more_alone(replicas: Sequence[str | None], listed: Sequence[Listed] | None) -> bool:
    """Whether the fleet's m=1 phase fires another alone request for a prompt, given the replica
    of each one so far: until every replica seen (and every one listed alive) has answered
    twice, so each is judged alone against itself and against the others. Without a listing, it
    looks for a second replica until the cap; a server that names no replica stops at two."""
    if len(replicas) < 2:
        return True
    if len(replicas) >= alone_cap(listed) or all(r is None for r in replicas):
        return False
    counts = Counter(r for r in replicas if r is not None)
    wanted = set(counts) | set(alive_ids(listed))
    if any(counts[r] < 2 for r in wanted):
        return True
    return listed is None and len(wanted) < 2


@dataclass(frozen=True)
class Reply:
    """One greedy reply as the fleet reads it; `entries` None for a refused reply."""

    prompt: int
    replica: str | None
    entries: Sequence[Entry] | None


@dataclass(frozen=True)
class Divergence:
    """Where two replicas' m=1 replies of one prompt first differ, token or logprob."""

    prompt: int
    replicas: tuple[str, str]
    token_index: int
    kind: Literal["token", "logprob"]
    tokens: tuple[str, str]
    logprobs: tuple[list[float | None], list[float | None]]  # chosen, then the top alternatives
    top2_margins: tuple[float | None, float | None]
    tokens_agree_to: int  # leading tokens equal (the shorter length if they never part)
    logprob_max_abs_diff: float | None  # over the agreeing tokens


def pair_divergence(prompt: int, a: str, b: str, first: Sequence[Entry], second: Sequence[Entry]) -> Divergence | None:
    """The first token where two replies differ, in identity or in any logprob (bitwise, as the
    probe compares logprobs with m=1), or None when they are equal throughout."""
    ids_a, ids_b = intern([[e.identity for e in first], [e.identity for e in second]])
    agree = agreement(ids_a, ids_b)
    parity = compare([e.logprob_vector for e in first], [e.logprob_vector for e in second], agree)
    parted = agree < min(len(first), len(second))
    if parity.first_diff_at is not None:
        at, kind = parity.first_diff_at, "logprob"
    elif parted:
        at, kind = agree, "token"
    elif len(first) != len(second):
        at, kind = agree, "token"  # one reply is longer: its next token has no counterpart
    else:
        return None
    ea = first[at] if at < len(first) else None
    eb = second[at] if at < len(second) else None
    return Divergence(
        prompt=prompt,
        replicas=(a, b),
        token_index=at,
        kind=kind,
        tokens=(ea.token if ea else "", eb.token if eb else ""),
        logprobs=(list(ea.logprob_vector) if ea else [], list(eb.logprob_vector) if eb else []),
        top2_margins=(ea.top2_margin if ea else None, eb.top2_margin if eb else None),
        tokens_agree_to=agree,
        logprob_max_abs_diff=parity.max_abs_diff,
    )


def representatives(alone: Sequence[Reply]) -> list[Reply]:
    """Each replica's first complete m=1 reply per prompt, in the order they came back."""
    seen: set[tuple[int, str | None]] = set()
    chosen = []
    for reply in alone:
        key = (reply.prompt, reply.replica)
        if reply.replica is None or reply.entries is None or key in seen:
            continue
        seen.add(key)
        chosen.append(reply)
    return chosen


def cross_replica(replies: Sequence[Reply]) -> tuple[int, int, Divergence | None]:
    """Every pair of replicas' replies of one prompt compared: (pairs compared, pairs that
    differ, the earliest difference; at a tie, the first pair in serving order)."""
    compared, found = 0, []
    for i, a in enumerate(replies):
        for b in replies[i + 1:]:
            if a.prompt != b.prompt or a.entries is None or b.entries is None:
                continue
            compared += 1
            divergence = pair_divergence(a.prompt, str(a.replica), str(b.replica), a.entries, b.entries)
            if divergence is not None:
                found.append(divergence)
    first = min(found, key=lambda d: d.token_index, default=None)
    return compared, len(found), first


@dataclass(frozen=True)
class FleetJudgement:
    result: Result
    reason: str | None
    replicas: list[dict[str, Any]]  # {id, alone, slots, numerics_id}, in first-served order
    unserved: list[str]  # listed alive by /v1/server_info, never served
    headerless: int  # replies that named no replica
    pairs_compared: int = 0
    pairs_diverged: int = 0
    divergence: Divergence | None = None


NO_HEADER = (
    "no reply carried an x-batchproof-replica header: the server does not say which replica "
    "served, so its replicas cannot be compared (is it a batchproof fleet?)"
)


def _served(alone: Sequence[Reply], slot_replicas: Sequence[str | None], listed: Sequence[Listed] | None
            ) -> list[dict[str, Any]]:
    numerics = {r.id: r.numerics_id for r in listed or ()}
    alone_counts = Counter(r.replica for r in alone if r.replica is not None)
    slot_counts = Counter(r for r in slot_replicas if r is not None)
    order = list(dict.fromkeys([*(r.replica for r in alone), *slot_replicas]))
    return [{"id": r, "alone": alone_counts[r], "slots": slot_counts[r], "numerics_id": numerics.get(r)}
            for r in order if r is not None]


def measured_alone(alone: Sequence[Reply]) -> set[str]:
    """The replicas with a complete m=1 reply to every prompt fired alone: those compared."""
    prompts = {reply.prompt for reply in alone}
    covered: dict[str, set[int]] = {}
    for reply in representatives(alone):
        covered.setdefault(str(reply.replica), set()).add(reply.prompt)
    return {replica for replica, seen in covered.items() if seen == prompts}


def _unmeasured(
    served: list[dict[str, Any]], measured: set[str], unserved: list[str], listed: Sequence[Listed] | None
) -> str | None:
    """Why agreement was not tested for the whole fleet, or None when it was."""
    if len(served) == 1:
        only = served[0]
        if unserved:
            others = f", though /v1/server_info lists {', '.join(unserved)} alive too"
        else:
            others = "; /v1/server_info lists no fleet" if listed is not None and not listed else ""
        return (f"only replica {only['id']} served (all {only['alone'] + only['slots']} replies{others}): "
                "cross-replica agreement was not tested")
    alone = [r["id"] for r in served if r["id"] in measured]
    parts = []
    if len(alone) < 2:
        parts.append(f"only {', '.join(alone) or 'no replica'} answered alone in full")
    for r in served:
        if not r["alone"]:
            parts.append(f"{r['id']} served {r['slots']} band slots but never alone")
        elif r["id"] not in measured:
            parts.append(f"{r['id']} has no complete alone reply to every prompt")
    if unserved:
        parts.append(f"{', '.join(unserved)} listed alive by /v1/server_info but never served")
    return None if not parts else "; ".join(parts) + ": cross-replica agreement was not tested for the whole fleet"


def judge_fleet(alone: Sequence[Reply], slot_replicas: Sequence[str | None], listed: Sequence[Listed] | None
                ) -> FleetJudgement:
    """FAIL when two replicas' m=1 replies of one prompt differ (each replica may still be
    self-consistent); UNMEASURABLE when no reply named its replica, when fewer than two replicas
    were measured alone, when a replica that served (or is listed alive) was never measured
    alone, or when some replies named no replica; else PASS."""
    served = _served(alone, slot_replicas, listed)
    unserved = [r for r in alive_ids(listed) if r not in {s["id"] for s in served}]
    headerless = sum(r.replica is None for r in alone) + sum(r is None for r in slot_replicas)
    if not served:
        return FleetJudgement("UNMEASURABLE", NO_HEADER, [], unserved, headerless)
    compared, diverged, first = cross_replica(representatives(alone))
    base = {"replicas": served, "unserved": unserved, "headerless": headerless, "pairs_compared": compared,
            "pairs_diverged": diverged, "divergence": first}
    if first is not None:
        return FleetJudgement("FAIL", divergence_reason(first), **base)
    why = _unmeasured(served, measured_alone(alone), unserved, listed)
    if why is None and headerless:
        why = f"{headerless} replies named no replica, so they could not be attributed"
    return FleetJudgement("UNMEASURABLE" if why else "PASS", why, **base)


def divergence_reason(d: Divergence) -> str:
    """The first cross-replica difference in words, with both sides' values and margins."""
    a, b = d.replicas
    if d.kind == "token":
        what = f"tokens {d.tokens[0]!r} vs {d.tokens[1]!r}"
    else:
        what = f"logprobs {d.logprobs[0]} vs {d.logprobs[1]} (token {d.tokens[0]!r})"
    margins = "/".join("-" if m is None else f"{m:.4g}" for m in d.top2_margins)
    return (f"replicas {a} and {b} disagree on prompt {d.prompt} at token {d.token_index}: {what}, "
            f"top-2 margins {margins}")


def with_fleet(run: Result, fleet: Result) -> Result:
    """The run's verdict with the fleet's: a disagreeing fleet fails even if every band passed."""
    if "FAIL" in (run, fleet):
        return "FAIL"
    return "UNMEASURABLE" if "UNMEASURABLE" in (run, fleet) else "PASS"


def served_by(band: Band) -> str:
    """Which replicas served a band's slots, each with its largest batch when known: `a:2(m=2), b:2(m=2)`."""
    counts = Counter(s.get("replica") or "(unnamed)" for s in band.slots or [])
    largest = band.m_formed_by_replica or {}
    return ", ".join(
        f"{replica}:{n}" + (f"(m={largest[replica]})" if largest.get(replica) is not None else "")
        for replica, n in sorted(counts.items())  # by id: the slots' arrival order is the network's
    )


def fleet_record(j: FleetJudgement) -> dict[str, Any]:
    """The witness's `fleet` section (an addition to v3)."""
    d = j.divergence
    divergence = None if d is None else {
        "prompt": d.prompt,
        "replicas": list(d.replicas),
        "token_index": d.token_index,
        "kind": d.kind,
        "tokens": list(d.tokens),
        "logprobs": [list(v) for v in d.logprobs],
        "top2_margins": list(d.top2_margins),
        "tokens_agree_to": d.tokens_agree_to,
        "logprob_max_abs_diff": d.logprob_max_abs_diff,
    }
    return {
        "result": j.result,
        "reason": j.reason,
        "num_replicas": len(j.replicas),
        "replicas": j.replicas,
        "unserved": j.unserved,
        "headerless": j.headerless,
        "pairs_compared": j.pairs_compared,
        "pairs_diverged": j.pairs_diverged,
        "divergence": divergence,
    }
