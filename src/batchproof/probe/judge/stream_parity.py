"""`--stream-parity`: every m=1 reference and band slot fetched again whole (`stream: false`), its
tokens, text and logprobs compared with the streamed reply's: servers format the two on two paths."""

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from batchproof.probe.judge.pair import compare_replies, describe, finding, section_result
from batchproof.probe.records.reply import StreamResult

# Every streamed reply the run compared is fetched whole once; the witness says so, so a future
# sampling (a share of the slots) would be visible to a reader.
SAMPLE = "every m=1 reference's first run and every band slot"


def judge_pairs(
    pairs: Sequence[tuple[str, StreamResult, StreamResult, str | None]], n_predict: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(label, streamed, whole, why a difference would not be the stream's) per pair: the records
    and findings. A streamed reply that another route of the same request already fails to
    reproduce (an unstable reference, a band that differs from m=1) cannot blame the stream."""
    records, findings = [], []
    for label, streamed, whole, why_not in pairs:
        diff = compare_replies(streamed, whole, n_predict)
        records.append({"where": label, **diff.record(), "attributable": why_not is None, "not_attributable": why_not})
        if diff.kind is not None:
            text = f"stream parity: {label}, whole vs streamed: {describe(diff, 'the streamed reply')}"
            if why_not is not None:
                text += f" (not attributable to streaming: {why_not})"
            findings.append(finding(diff.kind, text, why_not is None))
    return records, findings


def stream_parity_record(records: list[dict[str, Any]], findings: list[dict[str, Any]]) -> dict[str, Any]:
    result, reason = section_result(findings)
    return {"result": result, "reason": reason, "sample": SAMPLE, "num_pairs": len(records),
            "findings": findings, "pairs": records}


async def fetch_whole_band(prompts: Sequence[int], fire_whole: Callable[[int], Awaitable[StreamResult]]
                           ) -> list[StreamResult]:
    """A band's slots fired again at once, each asked for a whole reply."""
    return list(await asyncio.gather(*(fire_whole(p) for p in prompts)))
