"""The m=1 references: one per prompt, each fired twice; the run needs every one stable."""

from collections.abc import Sequence
from typing import Any

from batchproof.probe.logprob_parity import LogprobParity
from batchproof.probe.verdict import ReferenceJudgement
from batchproof.probe.witness import reference_record


def combined(judgements: Sequence[ReferenceJudgement]) -> ReferenceJudgement:
    """The run's reference: stable iff every prompt's is; the least self-agreement; the first
    reason, naming its prompt when there are several."""
    unstable = [(i, j) for i, j in enumerate(judgements) if not j.is_stable]
    agreed = [j.self_divergence_at for j in judgements]
    least = None if any(a is None for a in agreed) else min(a for a in agreed if a is not None)
    tokens = judgements[0].tokens
    if not unstable:
        return ReferenceJudgement(True, tokens, least, None)
    i, first = unstable[0]
    reason = first.reason if len(judgements) == 1 else f"prompt {i}: {first.reason}"
    return ReferenceJudgement(False, tokens, least, reason)


def prompt_reference_record(i: int, judgement: ReferenceJudgement, parity: LogprobParity) -> dict[str, Any]:
    """One prompt's reference in the witness, with how far its two runs' logprobs differ."""
    return {"prompt": i, **reference_record(judgement), "logprob_max_abs_diff": parity.max_abs_diff,
            "logprobs_bitwise_equal": parity.is_bitwise_equal}
