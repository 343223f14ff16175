"""Turning scheduled sequences into model inputs and logits (prefill and batched decode)."""

from dataclasses import dataclass

import torch

from batchproof.engine.kv_cache import KVCache
from batchproof.engine.logprobs import TokenRecord, build_records
from batchproof.engine.model.transformer import Segment, Transformer
from batchproof.engine.prefix_cache import Block, PrefixCache
from batchproof.engine.sequence import Sequence


@dataclass
class PrefillProgress:
    """A prompt part-way through prefill: what the steps so far computed."""

    begin: int  # the first position computed (before it: blocks from the prefix cache)
    ids: torch.Tensor  # the prompt's ids [n]
    computed: list[torch.Tensor]  # the hidden rows of each chunk since `begin`
    scored: list  # prompt records so far (when prompt logprobs are asked for)


class ModelRunner:
    def __init__(self, model: Transformer, cache: KVCache, max_batch: int, max_prefill_tokens: int,
                 prefix_cache: PrefixCache | None = None) -> None:
        self.model = model
        self.cache = cache
        self.max_batch = max_batch
        self.max_prefill_tokens = max_prefill_tokens
        self.prefix_cache = prefix_cache
        self.device = model.device

    def prefill(self, seqs: list[Sequence], num_tokens: list[int]) -> list[tuple[Sequence, torch.Tensor, list | None]]:
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
        size = self.max_prefill_tokens
        spans: list[tuple[Sequence, int, int]] = []  # (seq, first position, tokens) this step
        for seq, wanted in zip(seqs, num_tokens):
            if seq.prefill is None:
                self._start_prefill(seq)
            start, end = seq.num_computed, len(seq.prompt_ids)
            if self.model.ops.reuses_prefixes:
                stop = min(end, start + wanted)
            else:
                stop = min(end, (start // size + 1) * size)  # the rest of this grid chunk
            spans.append((seq, start, stop - start))
        groups = [spans] if self.model.ops.batches_prefill else [[span] for span in spans]
        for group in groups:
            done = {id(seq): 0 for seq, _, _ in group}
            while any(done[id(seq)] < n for seq, _, n in group):
                active = [(seq, start + done[id(seq)], min(size, n - done[id(seq)]))
                          for seq, start, n in group if done[id(seq)] < n]
                segments = [Segment(seq.prefill.ids[at:at + n], at, seq.slot) for seq, at, n in active]
                hidden = self.model.prefill(segments, self.cache)
                for (seq, at, n), rows in zip(active, hidden.split([n for _, _, n in active])):
                    seq.prefill.computed.append(rows)
                    if seq.params.prompt_logprobs is not None:
                        seq.prefill.scored += self._score(seq, at, rows)
                    seq.num_computed = at + n
                    done[id(seq)] += n
        finished = [seq for seq, _, _ in spans if seq.num_computed == len(seq.prompt_ids)]
        if not finished:
            return []
        rows = [seq.prefill.computed[-1][-1:] for seq in finished]
        # One LM-head call where rows cannot change each other's bits; else one call per prompt.
        calls = [torch.cat(rows)] if self.model.ops.batches_prefill else rows
        last_logits = torch.cat([self.model.logits(x) for x in calls]).cpu()
        results = []
        for seq, logits in zip(finished, last_logits):
            progress, seq.prefill = seq.prefill, None
            self._keep_prompt(seq, progress.begin, progress.computed, progress.scored)
            results.append((seq, logits, progress.scored if seq.params.prompt_logprobs is not None else None))
        return results

    def _start_prefill(self, seq: Sequence) -> None:
        scored: list = [None]  # nothing predicts a first token
        begin = self._reuse(seq, scored)
        seq.num_computed = begin
        seq.prefill = PrefillProgress(begin, torch.tensor(seq.prompt_ids, dtype=torch.int64, device=self.device),
                                      [], scored)

    # --- the prefix cache ---------------------------------------------------------------

    def _cache_for(self, seq: Sequence) -> PrefixCache | None:
        """The prefix cache, unless the request may neither reuse nor leave prefixes (a
        cache_namespace of None)."""
        return None if seq.params.cache_namespace is None else self.prefix_cache

    def _reuse(self, seq: Sequence, scored: list) -> int:
        """Copy the cached blocks that open seq's prompt into its slot (and score them when
        prompt logprobs are asked for) -> the first position left to compute."""
        cache = self._cache_for(seq)
        if cache is None:
            return 0
        n, size = len(seq.prompt_ids), cache.block_size
        wants_scores = seq.params.prompt_logprobs is not None
        # The last prompt token is always computed: its logits choose the first reply token.
        blocks = cache.match(seq.prompt_ids, n - 1, need_hidden=wants_scores, namespace=seq.params.cache_namespace)
        begin = len(blocks) * size
        cache.stats.queried_tokens += n
        cache.stats.hit_tokens += begin
        seq.num_cached_tokens = begin
        for i, block in enumerate(blocks):
            self.cache.write_block(seq.slot, i * size, block.k, block.v)
        if wants_scores and blocks:
            scored += self._cached_scores(seq, blocks)
        return begin

    def _cached_scores(self, seq: Sequence, blocks: list[Block]) -> list[TokenRecord]:
        """Records for the targets 1..begin of a cached prefix: kept ones where every block
        kept them at this top-N or more (the top-n of a row is the first n of its top-N), the
        last one, whose target lies past the prefix, through the LM head from its hidden
        state; else all of them from the hidden states."""
        top_n, size = seq.params.prompt_logprobs, self.prefix_cache.block_size
        begin = len(blocks) * size
        if all(block.records is not None and block.records_top >= top_n for block in blocks):
            kept = [record for block in blocks for record in block.records][1:]  # target 0 has none
            kept = [TokenRecord(r.step, r.token_id, r.logprob, r.top[:top_n]) for r in kept]
            return kept + self._score(seq, begin - 1, blocks[-1].hidden[-1:])
        hidden = torch.cat([block.hidden for block in blocks])
        records: list[TokenRecord] = []
        for start in range(0, begin, self.max_prefill_tokens):
            records += self._score(seq, start, hidden[start:start + self.max_prefill_tokens])
        return records

    def _keep_prompt(self, seq: Sequence, begin: int, computed: list[torch.Tensor], scored: list) -> None:
        """After prefill: the prompt's full blocks this sequence computed, with their hidden
        states, and its prompt records (block i keeps the records whose targets are its own
        positions) when it scored them."""
        cache = self._cache_for(seq)
        if cache is None:
            return
        size = cache.block_size
        keys = cache.keys(seq.prompt_ids, len(seq.prompt_ids) // size, seq.params.cache_namespace)
        top_n = seq.params.prompt_logprobs

        def records(i: int) -> list | None:
            return None if top_n is None else scored[i * size:(i + 1) * size]

        wanted = [i for i in cache.missing(keys, need_hidden=True) if i * size >= begin]
        if wanted:
            hidden = torch.cat(computed)
            cache.insert(keys, {i: self._block(seq.slot, i, hidden[i * size - begin:(i + 1) * size - begin],
                                               records(i), top_n) for i in wanted})
        if top_n is not None:  # blocks it found without records at this top-N learn them
            cache.add_records(keys, records, top_n)

    def retire(self, seq: Sequence) -> None:
        """As a sequence leaves its slot: the prefix cache keeps its blocks, then the slot's
        pages are released."""
        if seq.slot is None:
            return
        self._keep_retired(seq)
        self.cache.release(seq.slot)

    def _keep_retired(self, seq: Sequence) -> None:
        """The blocks of prompt and reply the sequence computed."""
        cache = self.prefix_cache
        if cache is None:
            return
        cache.leaving(seq.num_tokens * self.cache.bytes_per_token)
        if self._cache_for(seq) is None or seq.num_computed < cache.block_size:
            return
        tokens = (seq.prompt_ids + seq.output_ids)[:seq.num_computed]
        keys = cache.keys(tokens, len(tokens) // cache.block_size, seq.params.cache_namespace)
        cache.insert(keys, {i: self._block(seq.slot, i, None) for i in cache.missing(keys, need_hidden=False)})

    def _block(self, slot: int, index: int, hidden: torch.Tensor | None, records: list | None = None,
               records_top: int = 0) -> Block:
        k, v = self.cache.read_block(slot, index * self.prefix_cache.block_size, self.prefix_cache.block_size)
        return Block(k, v, None if hidden is None else hidden.clone(), records, records_top)

    def _score(self, seq: Sequence, start: int, rows: torch.Tensor) -> list[TokenRecord]:
        targets = seq.prompt_ids[start + 1:start + 1 + len(rows)]  # row i predicts token start + i + 1
        logits = self.model.logits(rows[:len(targets)]).cpu()
        top_n = seq.params.prompt_logprobs
        steps = list(range(start + 1, start + 1 + len(targets)))
        return build_records(logits, targets, [top_n] * len(targets), steps, self.model.ops.normalizer_and_top_k)

    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One new token for each sequence, all in one forward pass -> logits [len(seqs), V]."""
        num_seqs = len(seqs)
        rows = self.model.ops.decode_rows(num_seqs, self.max_batch)
        token_ids = torch.zeros(rows, dtype=torch.int64)
        positions = torch.zeros(rows, dtype=torch.int64)
        slots = torch.zeros(rows, dtype=torch.int64)
        token_ids[:num_seqs] = torch.tensor([s.output_ids[-1] for s in seqs])
        positions[:num_seqs] = torch.tensor([s.num_tokens - 1 for s in seqs])
        slots[:num_seqs] = torch.tensor([s.slot for s in seqs])
        hidden = self.model.decode(token_ids.to(self.device), positions.to(self.device), slots.to(self.device),
                                   num_seqs, self.cache)
        for seq in seqs:
            seq.num_computed = seq.num_tokens
        return self.model.logits(hidden)[:num_seqs].cpu()
