"""A decode step's drafts: each sequence's own, within what it may still emit, kept only where
the tokens they are expected to add pay for the rows they add to the step."""

from collections.abc import Callable

from batchproof.engine.draft.cost import expected_accepted, step_cost
from batchproof.engine.sequence import Sequence

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
    kept = _worth_their_rows(seqs, drafts, cost)
    for seq, draft, verified in zip(seqs, drafts, kept):
        if draft and not verified:  # checked next step against the token chosen instead (drafter.py)
            seq.drafter.shadow(draft, len(seq.output_ids))
    return kept


def _worth_their_rows(seqs: list[Sequence], drafts: list[list[int]],
                      cost: Callable[[int], float] = step_cost) -> list[list[int]]:
    """The drafts a step keeps: every sequence's, each cut to at most L tokens, for the L that
    gives the step the most tokens per unit of cost among those that slow no sequence in it;
    none when none does (as in a full batch of free text), so the step is the one plain
    decoding runs. Then the probes that fit where a row is cheap.

    A row is paid by every sequence in the step, and a sequence ahead of the rest does not
    bring their end nearer (with no one waiting, a slot it frees stays empty). So each
    sequence must expect at least the tokens per unit of cost it gets without drafts,
    (1 + accepted) / cost(rows) > 1 / cost(n): with one sequence, that its draft pays; with
    several, that every one drafts and the least promising draft pays for all the rows.
    Measured on a Zen 4, four mixed chat prompts at once, one of them copying (33 of 33 of its
    drafts accepted): it finished early and the other three decoded 10% slower than without
    speculation (docs/speculative.md)."""
    n = len(seqs)
    # a grammar's forced tokens are accepted for sure; a lookup draft as its acceptance says
    def gain(i: int, k: int) -> float:
        return float(k) if seqs[i].drafter.num_forced else expected_accepted(seqs[i].drafter.acceptance, k)

    best_cut, best_rate = 0, n / cost(n)
    if all(drafts):
        for cut in sorted({len(d) for d in drafts}, reverse=True):
            lengths = [min(len(d), cut) for d in drafts]
            rows = n + sum(lengths)
            if rows > MAX_STEP_ROWS:
                continue
            gains = [gain(i, k) for i, k in enumerate(lengths)]
            if (1 + min(gains)) / cost(rows) > 1 / cost(n) and (n + sum(gains)) / cost(rows) > best_rate:
                best_cut, best_rate = cut, (n + sum(gains)) / cost(rows)
    kept = [d[:best_cut] for d in drafts]
    rows = n + sum(map(len, kept))
    for i, d in enumerate(drafts):
        if not kept[i] and d and seqs[i].drafter.is_probing and rows + len(d) <= MAX_PROBE_ROWS:
            kept[i] = d
            rows += len(d)
    return kept
