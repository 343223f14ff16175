"""Turning scheduled sequences into model inputs and logits (prefill and batched decode)."""

import torch

from batchproof.engine.kv_cache import KVCache
from batchproof.engine.logprobs import TokenRecord, build_records
from batchproof.engine.model.transformer import Segment, Transformer
from batchproof.engine.prefix_cache import Block, PrefixCache
from batchproof.engine.sequence import Sequence


class ModelRunner:
    def __init__(self, model: Transformer, cache: KVCache, max_batch: int, max_prefill_tokens: int,
                 prefix_cache: PrefixCache | None = None) -> None:
        self.model = model
        self.cache = cache
        self.max_batch = max_batch
        self.max_prefill_tokens = max_prefill_tokens
        self.prefix_cache = prefix_cache
        self.device = model.device

    def prefill(self, seqs: list[Sequence]) -> list[tuple[torch.Tensor, list[TokenRecord | None] | None]]:
        """Feed the prompts of newly admitted sequences -> per sequence, (its last position's
        logits [V], its prompt records or None).

        A prompt's opening blocks come from the prefix cache when it holds them; the rest is
        cut into chunks of max_prefill_tokens. Where the model can share a call without
        changing a bit (`batches_prefill`), the chunks of every newcomer go through
        together, else one prompt at a time. Prompt scoring turns each chunk's logits into
        records at once, so at most one chunk of logits is held.
        """
        groups = [seqs] if self.model.ops.batches_prefill else [[seq] for seq in seqs]
        size = self.max_prefill_tokens
        results: dict[int, tuple] = {}
        for group in groups:
            scored: dict[int, list] = {id(s): [None] for s in group}  # nothing predicts a first token
            begin = {id(s): self._reuse(s, scored[id(s)]) for s in group}
            ids = {id(s): torch.tensor(s.prompt_ids, dtype=torch.int64, device=self.device) for s in group}
            computed: dict[int, list[torch.Tensor]] = {id(s): [] for s in group}
            num_chunks = max(-(-(len(s.prompt_ids) - begin[id(s)]) // size) for s in group)
            for chunk in range(num_chunks):
                active = [s for s in group if begin[id(s)] + chunk * size < len(s.prompt_ids)]
                starts = [begin[id(s)] + chunk * size for s in active]
                segments = [Segment(ids[id(s)][start:start + size], start, s.slot) for s, start in zip(active, starts)]
                hidden = self.model.prefill(segments, self.cache)
                for seq, start, rows in zip(active, starts, hidden.split([len(seg.token_ids) for seg in segments])):
                    computed[id(seq)].append(rows)
                    if seq.params.prompt_logprobs is not None:
                        scored[id(seq)] += self._score(seq, start, rows)
            last_logits = self.model.logits(torch.cat([computed[id(s)][-1][-1:] for s in group])).cpu()
            for seq, logits in zip(group, last_logits):
                seq.num_computed = len(seq.prompt_ids)
                self._keep_prompt(seq, begin[id(seq)], computed[id(seq)], scored[id(seq)])
                results[id(seq)] = (logits, scored[id(seq)] if seq.params.prompt_logprobs is not None else None)
        return [results[id(seq)] for seq in seqs]

    # --- the prefix cache ---------------------------------------------------------------

    def _reuse(self, seq: Sequence, scored: list) -> int:
        """Copy the cached blocks that open seq's prompt into its slot (and score them when
        prompt logprobs are asked for) -> the first position left to compute."""
        cache = self.prefix_cache
        if cache is None:
            return 0
        n, size = len(seq.prompt_ids), cache.block_size
        wants_scores = seq.params.prompt_logprobs is not None
        # The last prompt token is always computed: its logits choose the first reply token.
        blocks = cache.match(seq.prompt_ids, n - 1, need_hidden=wants_scores)
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
        cache = self.prefix_cache
        if cache is None:
            return
        size = cache.block_size
        keys = cache.keys(seq.prompt_ids, len(seq.prompt_ids) // size)
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
        if seq.num_computed < cache.block_size:
            return
        tokens = (seq.prompt_ids + seq.output_ids)[:seq.num_computed]
        keys = cache.keys(tokens, len(tokens) // cache.block_size)
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
