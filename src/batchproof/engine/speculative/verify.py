"""A decode step's drafts verified: each sequence's rows (after its last token, then after each
drafted token) read in order, one position at a time, through the same OutputProcessor as plain
decoding, so each emitted token, record, grammar step and random draw is the one plain decoding
makes at that position; a sequence stops at the first position whose chosen token is not the
drafted one (that token, the model's own, is kept) or where it finishes."""

from dataclasses import dataclass

import torch

from batchproof.engine.outputs import OutputProcessor, RequestOutput
from batchproof.engine.sequence import Sequence


@dataclass
class Verified:
    outputs: list[RequestOutput]  # one per sequence, its positions' deltas joined
    # Each sequence's valid positions, for the runner (ModelRunner.accept): the last fed token's
    # and the accepted drafts'. Past them (rejected drafts) nothing counts as computed, so the
    # next step overwrites those positions and the prefix cache never keeps them.
    num_computed: list[int]


def verify(outputs: OutputProcessor, seqs: list[Sequence], drafts: list[list[int]],
           logits: torch.Tensor) -> Verified:
    """logits [sum(len(d) + 1), V]: seqs[i]'s rows together, in order (ModelRunner.decode)."""
    starts = torch.tensor([0, *(len(d) + 1 for d in drafts)]).cumsum(0).tolist()
    last_positions = [seq.num_tokens - 1 for seq in seqs]
    merged: dict[int, RequestOutput] = {}
    num_accepted = [0] * len(seqs)
    active, at = list(range(len(seqs))), 0
    while active:
        # Only the sequences still matching take position `at`: the draw a sampled sequence
        # makes there is its at-th since the step began, as in plain decoding.
        rows = logits[torch.tensor([starts[i] + at for i in active])]
        step_outputs = outputs.process([seqs[i] for i in active], rows, [None] * len(active))
        going = []
        for i, out in zip(active, step_outputs):
            merged[i] = _join(merged[i], out) if i in merged else out
            seq = seqs[i]
            if at < len(drafts[i]) and not seq.is_finished and seq.output_ids[-1] == drafts[i][at]:
                num_accepted[i] += 1
                going.append(i)
        active, at = going, at + 1
    for i, seq in enumerate(seqs):
        if drafts[i]:
            seq.drafter.observe(len(drafts[i]), num_accepted[i])
            merged[i].num_draft_tokens = seq.drafter.num_proposed
            merged[i].num_accepted_tokens = seq.drafter.num_accepted
    # The keys and values written for accepted drafts are the ones decoding them would write.
    return Verified([merged[i] for i in range(len(seqs))],
                    [last + 1 + accepted for last, accepted in zip(last_positions, num_accepted)])


def _join(first: RequestOutput, then: RequestOutput) -> RequestOutput:
    """Two consecutive deltas of one request as one: the text, records and ids of both; the
    counts and ending of the later."""
    then.text = first.text + then.text
    then.records = first.records + then.records
    then.token_ids = first.token_ids + then.token_ids
    then.prompt_records = first.prompt_records
    return then
