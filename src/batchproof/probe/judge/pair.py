"""Two replies to one request, compared token by token, text and logprobs: the judgement shared by
`--cache` (warm against cold) and `--stream-parity` (streamed against whole)."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from batchproof.common.band import Band
from batchproof.probe.judge.logprob_parity import UNMEASURED, LogprobParity, compare
from batchproof.probe.judge.references import sample
from batchproof.probe.judge.verdict import Result, agreement, intern, refusal
from batchproof.probe.records.reply import StreamResult

Kind = Literal["refused", "token", "text", "logprob"]


@dataclass(frozen=True)
class PairDiff:
    """`got` against `reference`: why they could not be compared, else how far the tokens agree,
    whether the texts match (only meaningful when every token does) and the logprob parity."""

    refused: str | None
    tokens_agree_to: int | None = None
    is_token_diverged: bool = False
    is_text_equal: bool | None = None
    parity: LogprobParity = UNMEASURED

    @property
    def kind(self) -> Kind | None:
        """What differs first in importance: a refusal, a token, the text, a logprob; None: nothing."""
        if self.refused is not None:
            return "refused"
        if self.is_token_diverged:
            return "token"
        if self.is_text_equal is False:
            return "text"
        if self.parity.is_bitwise_equal is False:
            return "logprob"
        return None

    def record(self) -> dict[str, Any]:
        return {"refused": self.refused, "tokens_agree_to": self.tokens_agree_to, "text_equal": self.is_text_equal,
                "logprob_max_abs_diff": self.parity.max_abs_diff,
                "logprobs_bitwise_equal": self.parity.is_bitwise_equal,
                "logprob_first_diff_at": self.parity.first_diff_at}


def compare_replies(reference: StreamResult, got: StreamResult, n_predict: int) -> PairDiff:
    for label, result in (("reference", reference), ("reply", got)):
        why = refusal(sample(result), n_predict)
        if why is not None:
            return PairDiff(f"{label}: {why}")
    ref_ids, got_ids = intern([[e.identity for e in reference.entries], [e.identity for e in got.entries]])
    agree = agreement(ref_ids, got_ids)
    diverged = agree < max(len(ref_ids), len(got_ids))
    parity = compare(reference.logprob_vectors(), got.logprob_vectors(), agree)
    return PairDiff(None, agree, diverged, None if diverged else reference.text == got.text, parity)


def describe(diff: PairDiff, against: str) -> str:
    """What differs, in words, sized: `logprobs differ from the cold run's by up to 1e-06, first at token 0`."""
    kind = diff.kind
    if kind == "refused":
        return f"not compared ({diff.refused})"
    if kind == "token":
        return f"tokens part from {against} at token {diff.tokens_agree_to}"
    if kind == "text":
        return f"same tokens, but the text differs from {against}"
    if kind == "logprob":
        size = diff.parity.max_abs_diff
        return (f"logprobs differ from {against} by up to {size:.3g}, first at token {diff.parity.first_diff_at}"
                if size is not None else f"logprobs differ from {against}")
    return f"same tokens, text and logprobs as {against}"


def finding(kind: Kind, text: str, is_attributable: bool) -> dict[str, Any]:
    """One difference as the witness records it; the check judges the attributable ones."""
    return {"kind": kind, "text": text, "attributable": is_attributable}


def section_result(findings: list[dict[str, Any]], problem: str | None = None) -> tuple[Result, str | None]:
    """A mode's verdict: FAIL on an attributable difference, UNMEASURABLE when something could
    not be compared (or `problem`), else PASS; the reason is the first that decided it."""
    failed = [f for f in findings if f["attributable"] and f["kind"] != "refused"]
    if failed:
        return "FAIL", failed[0]["text"]
    refused = [f for f in findings if f["kind"] == "refused"]
    if problem is not None or refused:
        return "UNMEASURABLE", problem or refused[0]["text"]
    return "PASS", None


def band_noise(bands: Sequence[Band], c: int) -> str | None:
    """Why a difference inside a band of c could be batching rather than the route under test:
    its plain band (same c, streamed, no cache arranged) already differs from m=1, or was not
    measured. None when that band was bitwise equal to m=1 throughout."""
    plain = [b for b in bands if b.c == c]
    if not plain:
        return f"the plain c={c} band was not measured"
    band = plain[0]
    parted = any(s["divergence_at"] is None or s["divergence_at"] < (s["completion_tokens"] or 0)
                 for s in band.slots)
    if band.logprobs_bitwise_equal is not True or parted:
        return f"the plain c={c} band already differs from m=1"
    if band.result != "PASS":  # e.g. UNMEASURABLE: a server of one slot served the c requests one by one
        return f"the plain c={c} band is {band.result}, so its batching is not known to be exact"
    return None
