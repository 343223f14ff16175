"""Sequences -> tensors -> logits: prefill and batched decode in the slots of the KV cache, with
the cache manager's two calls around a prompt's prefill (what the prefix cache gives, what it keeps)."""

from dataclasses import dataclass

import numpy as np
import torch

from batchproof.engine.cache.manager import CacheManager
from batchproof.engine.model.moe.receipt import by_position
from batchproof.engine.model.transformer import Segment, Transformer
from batchproof.engine.sampling.logprobs import TokenRecord, build_records
from batchproof.engine.sequence import PrefillProgress, Reused, Sequence

Prefilled = tuple[Sequence, torch.Tensor, list | None]  # a completed prompt, its last logits [V], its prompt records


@dataclass(frozen=True)
class Span:
    """A prompt's share of one prefill step: its positions up to `stop` (how far the step got
    is its sequence's num_computed)."""

    seq: Sequence
    stop: int


class ModelRunner:
    def __init__(self, model: Transformer, caches: CacheManager, max_batch: int, max_prefill_tokens: int) -> None:
        self.model = model
        self.caches = caches
        self.max_batch = max_batch
        self.max_prefill_tokens = max_prefill_tokens
        self.device = model.device
        self._decode_logits: torch.Tensor | None = None  # see _logits_buffer

    def prefill(self, seqs: list[Sequence], num_tokens: list[int]) -> list[Prefilled]:
        """Feed the next num_tokens[i] prompt tokens of seqs[i] -> for each prompt that this
        step completed, (its sequence, its last position's logits [V], its prompt records or
        None). A prompt may take several steps (decode steps run between them), resuming where
        it stopped (`seq.prefill`).

        A prompt's opening blocks come from the prefix cache when it holds them. Where a
        position's bits do not depend on how the prompt was cut (`reuses_prefixes`: our
        kernels), a step feeds any number of tokens; elsewhere (torch's BLAS) it feeds the rest
        of a chunk on the grid of max_prefill_tokens from position 0, whatever was asked, so
        the bits of a prompt never depend on what else was running. Where the model can share
        a call without changing a bit (`batches_prefill`), the chunks of several prompts go
        through together. Prompt scoring turns each chunk's logits into records at once.
        """
        spans = [self._span(seq, wanted) for seq, wanted in zip(seqs, num_tokens)]
        for group in [spans] if self.model.ops.batches_prefill else [[span] for span in spans]:
            self._feed(group)
        return self._finish([span.seq for span in spans if span.seq.num_computed == span.seq.prefill_len])

    def _span(self, seq: Sequence, wanted: int) -> Span:
        if seq.prefill is None:
            self._start_prefill(seq)
        start, end, size = seq.num_computed, seq.prefill_len, self.max_prefill_tokens
        if self.model.ops.reuses_prefixes:
            return Span(seq, min(end, start + wanted))
        return Span(seq, min(end, (start // size + 1) * size))  # the rest of this grid chunk

    def _start_prefill(self, seq: Sequence) -> None:
        """Its opening blocks from the prefix cache (and their prompt records, when it scores).
        A refill (a keep-mode weight swap) computes every position afresh and scores nothing: its
        prompt was scored, if asked, under the weights that chose its first token."""
        # Copied at admission (a prefill started over after a weight swap asks again).
        reused = Reused() if seq.is_refilling else self.caches.take_reused(seq)
        scored: list = [None, *reused.records]  # nothing predicts a first token
        size = self.max_prefill_tokens
        for start, rows in reused.unscored:
            for at in range(0, len(rows), size):
                scored += self._score(seq, start + at, rows[at:at + size])
        seq.num_computed = reused.num_tokens
        if reused.routes is not None:  # the reused positions' routing, kept with them
            seq.reuse_routes(reused.routes)
        ids = torch.tensor(seq.prefill_ids, dtype=torch.int64, device=self.device)
        seq.prefill = PrefillProgress(reused.num_tokens, ids, [], scored)

    def _feed(self, group: list[Span]) -> None:
        """The group's spans through the model, each a chunk of at most max_prefill_tokens a call."""
        size = self.max_prefill_tokens
        while active := [(span.seq, span.seq.num_computed, min(size, span.stop - span.seq.num_computed))
                         for span in group if span.seq.num_computed < span.stop]:
            segments = [Segment(seq.prefill.ids[at:at + n], at, seq.slot) for seq, at, n in active]
            routes = [] if any(seq.routes is not None for seq, _, _ in active) else None
            hidden = self.model.prefill(segments, self.caches.kv, routes, self._forced(active))
            self._add_routes([seq for seq, _, _ in active], [n for _, _, n in active], routes)
            for (seq, at, n), rows in zip(active, hidden.split([n for _, _, n in active])):
                seq.prefill.computed.append(rows)
                if seq.params.prompt_logprobs is not None and not seq.is_refilling:
                    seq.prefill.scored += self._score(seq, at, rows)
                seq.num_computed = at + n

    def _finish(self, finished: list[Sequence]) -> list[Prefilled]:
        """The completed prompts' last logits; the prefix cache keeps their new blocks."""
        if not finished:
            return []
        rows = [seq.prefill.computed[-1][-1:] for seq in finished]
        # One LM-head call where rows cannot change each other's bits; else one call per prompt.
        calls = [torch.cat(rows)] if self.model.ops.batches_prefill else rows
        last_logits = torch.cat([self.model.logits(x) for x in calls]).cpu()
        results = []
        for seq, logits in zip(finished, last_logits):
            progress, seq.prefill = seq.prefill, None
            if seq.is_refilling:  # its logits choose its next token; its blocks go to the cache as it leaves
                seq.is_refilling = False
                results.append((seq, logits, None))
                continue
            self.caches.keep_prompt(seq, progress.begin, progress.computed, progress.scored)
            results.append((seq, logits, progress.scored if seq.params.prompt_logprobs is not None else None))
        return results

    def _score(self, seq: Sequence, start: int, rows: torch.Tensor) -> list[TokenRecord]:
        return score_prompt_rows(self.model, seq, start, rows)

    def decode(self, seqs: list[Sequence], drafts: list[list[int]] | None = None) -> torch.Tensor:
        """The next token of each sequence, all in one forward pass -> logits [rows, V]: one row per
        sequence, or with drafts, seqs[i]'s rows together: after its last token, then after each
        of drafts[i] (fed at the positions that follow). Every row is a decode row of its own
        position (each attends to the keys up to it, written in the same layer before any row
        reads them), so it has the bits a step that fed those tokens one at a time gives."""
        drafts = drafts or [[] for _ in seqs]
        fed = [[s.output_ids[-1], *d] for s, d in zip(seqs, drafts)]
        num_real = sum(len(f) for f in fed)
        rows = self.model.ops.decode_rows(num_real, self.max_batch)
        token_ids = torch.zeros(rows, dtype=torch.int64)
        positions = torch.zeros(rows, dtype=torch.int64)
        slots = torch.zeros(rows, dtype=torch.int64)
        token_ids[:num_real] = torch.tensor([t for f in fed for t in f])
        positions[:num_real] = torch.tensor([s.num_tokens - 1 + j for s, f in zip(seqs, fed) for j in range(len(f))])
        slots[:num_real] = torch.tensor([s.slot for s, f in zip(seqs, fed) for _ in f])
        routes = [] if any(seq.routes is not None for seq in seqs) else None
        hidden = self.model.decode(token_ids.to(self.device), positions.to(self.device), slots.to(self.device),
                                   num_real, self.caches.kv, routes)
        self._add_routes(seqs, [len(f) for f in fed], routes)
        for seq in seqs:
            seq.num_computed = seq.num_tokens
        return self.model.logits(hidden, out=self._logits_buffer(hidden.shape[0]))[:num_real].cpu()

    def _forced(self, active: list[tuple[Sequence, int, int]]) -> torch.Tensor | None:
        """The step's replayed routing [rows, MoE layers, k] (-1s where a row routes freely), or
        None when no sequence in it replays one (SamplingParams.forced_routes)."""
        claims = [seq.params.forced_routes for seq, _, _ in active]
        if all(claim is None for claim in claims):
            return None
        shape = next(claim for claim in claims if claim is not None).shape[1:]
        forced = torch.full((sum(n for _, _, n in active), *shape), -1, dtype=torch.int64)
        row = 0
        for (_, at, n), claim in zip(active, claims):
            if claim is not None and at < len(claim):
                rows = claim[at:at + n]
                forced[row:row + len(rows)] = torch.from_numpy(rows.astype(np.int64))
            row += n
        return forced.to(self.device)

    @staticmethod
    def _add_routes(seqs: list[Sequence], num_rows: list[int], routes: list[torch.Tensor] | None) -> None:
        """The step's routes (each MoE layer's ids for every real row, the rows in seqs' order,
        num_rows[i] of them seqs[i]'s) -> the rows of each sequence that asked for them."""
        if routes is None:
            return
        rows = by_position(routes)[:sum(num_rows)].cpu()  # [real rows, layers, k] (decode pads past them)
        for seq, own in zip(seqs, rows.split(num_rows)):
            if seq.routes is not None:
                seq.routes.append(own)

    # --- what a slot holds, changed from outside a forward pass --------------------------

    def accept(self, seqs: list[Sequence], num_computed: list[int]) -> None:
        """After a speculative step: each sequence's valid positions, the last fed token's and
        its accepted drafts' (past them, the rejected drafts' keys are overwritten next step
        and never reach the prefix cache)."""
        for seq, n in zip(seqs, num_computed):
            seq.num_computed = n
            seq.keep_routes(n)

    def discard(self, seq: Sequence) -> None:
        """Its step raised: its keys and values may be half written, so none counts as computed
        (the prefix cache keeps nothing of it when it is retired)."""
        seq.num_computed = 0

    def restart(self, seq: Sequence, refill: bool) -> None:
        """The weights under it changed (a keep swap): nothing in its slot counts; its prompt
        (and, with `refill`, its reply so far) is fed again from position 0 before it goes on."""
        seq.num_computed = 0
        seq.prefill = None
        seq.is_refilling = refill
        seq.keep_routes(0)

    def _logits_buffer(self, rows: int) -> torch.Tensor:
        """[rows, V], the same memory every decode step: the step's logits are read before the
        next step starts (outputs.py keeps no row), and a new [16, 262144] tensor each step
        would cost Gemma 3 4,096 page faults a step once glibc maps such blocks (memory.py)."""
        if self._decode_logits is None or self._decode_logits.shape[0] < rows:
            self._decode_logits = torch.empty(max(rows, self.max_batch), self.model.lm_head.shape[0],
                                              dtype=torch.float32, device=self.device)
        return self._decode_logits[:rows]


def score_prompt_rows(model: Transformer, seq: Sequence, start: int, rows: torch.Tensor) -> list[TokenRecord]:
    """The records of the prompt positions a prefill chunk's rows predict (row i: token start + i
    + 1): how a prompt is scored, here and when a receipt's prefill is replayed (replay.py)."""
    targets = seq.prompt_ids[start + 1:start + 1 + len(rows)]
    if not targets:
        return []
    logits = model.logits(rows[:len(targets)]).cpu()
    params = seq.params
    steps = list(range(start + 1, start + 1 + len(targets)))
    return build_records(logits, targets, [params.prompt_logprobs] * len(targets), steps,
                         model.ops.normalizer_and_top_k, [params.tail_logprobs] * len(targets),
                         [params.named_ids_at(step) for step in steps])
