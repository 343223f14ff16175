"""One logprob entry, read leniently from any OpenAI-compatible server."""

import math
from dataclasses import dataclass
from typing import Any

# ABSENT_LOGPROB: OpenAI's stand-in for a logprob of -inf; it marks an absent alternative, not a value.
from batchproof.common.wire import ABSENT_LOGPROB

# A token's identity: its text and its exact bytes (null bytes read as empty).
Identity = tuple[str, tuple[int, ...]]


class EntryError(ValueError):
    """An entry the probe cannot read; the request that carried it is refused."""


@dataclass(frozen=True)
class Entry:
    token: str
    token_bytes: tuple[int, ...]
    logprob: float | None
    top_logprobs: tuple[float | None, ...]

    @property
    def identity(self) -> Identity:
        return (self.token, self.token_bytes)

    @property
    def top2_margin(self) -> float | None:
        return top2_margin(self.top_logprobs)

    @property
    def logprob_vector(self) -> tuple[float | None, ...]:
        """Its logprob, then its alternatives', as logprob parity compares them."""
        return (self.logprob, *self.top_logprobs)


def top2_margin(logprobs: tuple[float | None, ...] | list[float | None]) -> float | None:
    """Largest minus second largest finite logprob; None with fewer than two."""
    finite = sorted(
        (x for x in logprobs if x is not None and math.isfinite(x) and x > ABSENT_LOGPROB),
        reverse=True,
    )
    return finite[0] - finite[1] if len(finite) >= 2 else None


def parse_entry(raw: Any) -> Entry:
    """Read one `logprobs.content` entry; unknown keys (llama.cpp's `id`) are ignored."""
    if not isinstance(raw, dict):
        raise EntryError(f"entry is not an object: {raw!r:.80}")
    token = raw.get("token")
    if not isinstance(token, str):
        raise EntryError(f"entry has no string token: {raw!r:.80}")
    tops = raw.get("top_logprobs")
    if tops is None:
        tops = []
    if not isinstance(tops, list):
        raise EntryError(f"entry {token!r}: top_logprobs is not a list")
    return Entry(
        token=token,
        token_bytes=_read_bytes(raw.get("bytes"), token),
        logprob=_read_logprob(raw.get("logprob")),
        top_logprobs=tuple(_read_logprob(t.get("logprob")) for t in tops if isinstance(t, dict)),
    )


def _read_bytes(raw: Any, token: str) -> tuple[int, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= 255 for b in raw
    ):
        raise EntryError(f"entry {token!r}: bytes is not a list of 0..255: {raw!r:.80}")
    return tuple(raw)


def _read_logprob(raw: Any) -> float | None:
    # A null, a non-number or -9999 all mean "not given"; only the margin reads these.
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return None
    value = float(raw)
    return value if math.isfinite(value) and value > ABSENT_LOGPROB else None


def parse_legacy(raw: Any) -> list[Entry]:
    """Entries from a legacy /v1/completions `logprobs` object: parallel `tokens`,
    `token_logprobs` and `top_logprobs` ({token: logprob} per position). It carries no bytes."""
    if not isinstance(raw, dict):
        raise EntryError(f"logprobs is not an object: {raw!r:.80}")
    tokens = raw.get("tokens") or []
    values = raw.get("token_logprobs") or []
    tops = raw.get("top_logprobs") or []
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise EntryError(f"logprobs.tokens is not a list of strings: {tokens!r:.80}")
    if not isinstance(values, list) or not isinstance(tops, list):
        raise EntryError("logprobs.token_logprobs and logprobs.top_logprobs must be lists")
    entries = []
    for i, token in enumerate(tokens):
        top = tops[i] if i < len(tops) else None
        alternatives = tuple(_read_logprob(v) for v in top.values()) if isinstance(top, dict) else ()
        value = _read_logprob(values[i]) if i < len(values) else None
        entries.append(Entry(token=token, token_bytes=(), logprob=value, top_logprobs=alternatives))
    return entries
