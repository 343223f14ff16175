"""A decode step's drafts: each sequence's own, within what it may still emit, kept only where
the tokens they are expected to add pay for the rows they add to the step."""

from collections.abc import Callable

from batchproof.engine.sequence import Sequence
from batchproof.engine.speculative.cost import expected_accepted, step_cost

# At most this many rows in a step with drafts. Past 16 a row costs ~0.27 of a one-row step
# against ~0.38 per token in a full step (cost.py), so a draft could gain at best a few percent
# there, while a sequence that drafts ahead finishes early and leaves the rest of its batch to
# run in smaller, costlier steps: modelled on 16 copying requests at once, drafting in full
# batches cost 15-20% of their throughput. A full batch therefore decodes as without drafts.
MAX_STEP_ROWS = 16
# A probe (the draft of a sequence whose measured acceptance pays for none, so that it can
# notice when its reply starts copying) is verified only in a step of fewer rows than this:
# up to 4 rows the kernels unpack each weight block once for all of them, so the row costs
# ~0.2 of a one-row step, and the sequence's back-off (drafter.py) makes probes rare.
MAX_PROBE_ROWS = 4


def propose(seqs: list[Sequence], max_model_len: int,
            cost: Callable[[int], float] = step_cost) -> list[list[int]]:
    """Per sequence, the tokens to verify after its last one. A draft never runs past the
    reply's max_tokens (k drafts emit up to k + 1 tokens) nor the context. Which drafts a step
    keeps, and how long each is, never changes a bit, only how many tokens the step emits."""
    drafts = []
    for seq in seqs:
        room = min(seq.params.max_tokens - len(seq.output_ids) - 1, max_model_len - seq.num_tokens)
        forced = seq.grammar.forced() if seq.grammar is not None and seq.drafter is not None else None
        drafts.append(seq.drafter.propose(seq.output_ids, room, forced) if seq.drafter is not None else [])
    return _worth_their_rows(seqs, drafts, cost)


def _worth_their_rows(seqs: list[Sequence], drafts: list[list[int]],
                      cost: Callable[[int], float] = step_cost) -> list[list[int]]:
    """The drafts of the m most promising sequences (by expected tokens per drafted row), for
    the m that gives the step the most tokens per unit of cost; m = 0 (none) when nothing pays,
    as in a full batch of free text, so the step is the one plain decoding runs."""
    n = len(seqs)
    # a grammar's forced tokens are accepted for sure; a lookup draft as its acceptance says
    gains = {i: float(len(d)) if seqs[i].drafter.num_forced else expected_accepted(seqs[i].drafter.acceptance, len(d))
             for i, d in enumerate(drafts) if d}
    order = sorted(gains, key=lambda i: gains[i] / len(drafts[i]), reverse=True)
    best_m, best_rate = 0, n / cost(n)
    rows, tokens = n, float(n)
    for m, i in enumerate(order, start=1):
        rows, tokens = rows + len(drafts[i]), tokens + gains[i]
        if rows > MAX_STEP_ROWS:
            break
        if tokens / cost(rows) > best_rate:
            best_m, best_rate = m, tokens / cost(rows)
    kept = set(order[:best_m])
    rows = n + sum(len(drafts[i]) for i in kept)
    for i in order[best_m:]:
        if seqs[i].drafter.is_probing and rows + len(drafts[i]) <= MAX_PROBE_ROWS:
            kept.add(i)
            rows += len(drafts[i])
    return [d if i in kept else [] for i, d in enumerate(drafts)]
