"""Prefix reuse around a sequence's prefill: before it, what the cache holds of the prompt
(copied into the sequence's slot); after it, the prompt's new whole blocks kept; and as the
sequence leaves its slot, the blocks of prompt and reply it computed.

The glue between the prefix cache (keyed blocks), the KV cache (slots) and prompt scoring:
the runner calls `reuse` and `keep_prompt`, the release of a slot `keep_retired`. A request
with a cache_namespace of None neither reuses nor leaves prefixes; with no cache (off, or a
backend that cannot promise the bits) every call does nothing."""

from dataclasses import dataclass, field

import torch

from batchproof.engine.cache.kv_cache import KVCache
from batchproof.engine.cache.prefix_cache import Block, PrefixCache
from batchproof.engine.logprobs import TokenRecord
from batchproof.engine.sequence import Sequence


@dataclass
class Reused:
    """What the cache gave a prompt: its first num_tokens positions, now in the slot. For a
    request scoring its prompt, the records of the targets 1..num_tokens: the kept ones, then
    (first position, hidden rows [n, dim]) still to go through the LM head."""

    num_tokens: int = 0
    records: list[TokenRecord] = field(default_factory=list)
    unscored: list[tuple[int, torch.Tensor]] = field(default_factory=list)


class PrefixReuse:
    def __init__(self, cache: PrefixCache | None, kv: KVCache) -> None:
        self.cache = cache
        self.kv = kv

    def _cache_for(self, seq: Sequence) -> PrefixCache | None:
        return None if seq.params.cache_namespace is None else self.cache

    def reuse(self, seq: Sequence) -> Reused:
        """Before prefill: copy the cached blocks that open seq's prompt into its slot."""
        cache = self._cache_for(seq)
        if cache is None:
            return Reused()
        n, size, top_n = len(seq.prompt_ids), cache.block_size, seq.params.prompt_logprobs
        # The last prompt token is always computed: its logits choose the first reply token.
        blocks = cache.match(seq.prompt_ids, n - 1, need_hidden=top_n is not None,
                             namespace=seq.params.cache_namespace)
        begin = len(blocks) * size
        cache.stats.queried_tokens += n
        cache.stats.hit_tokens += begin
        seq.num_cached_tokens = begin
        for i, block in enumerate(blocks):
            self.kv.write_block(seq.slot, i * size, block.k, block.v)
        if top_n is None or not blocks:
            return Reused(begin)
        if all(block.records is not None and block.records_top >= top_n for block in blocks):
            # Kept where every block kept them at this top-N or more (the top-n of a row is the
            # first n of its top-N); the last target lies past the prefix: its row is scored.
            kept = [record for block in blocks for record in block.records][1:]  # target 0 has none
            kept = [TokenRecord(r.step, r.token_id, r.logprob, r.top[:top_n]) for r in kept]
            return Reused(begin, kept, [(begin - 1, blocks[-1].hidden[-1:])])
        return Reused(begin, [], [(0, torch.cat([block.hidden for block in blocks]))])

    def keep_prompt(self, seq: Sequence, begin: int, computed: list[torch.Tensor], scored: list) -> None:
        """After prefill: the prompt's whole blocks from `begin` on (computed: the hidden rows of
        each chunk since `begin`), with their hidden states and, when it scored them, its prompt
        records (block i keeps the records whose targets are its own positions)."""
        cache = self._cache_for(seq)
        if cache is None:
            return
        size, top_n = cache.block_size, seq.params.prompt_logprobs
        keys = cache.keys(seq.prompt_ids, len(seq.prompt_ids) // size, seq.params.cache_namespace)

        def records(i: int) -> list | None:
            return None if top_n is None else scored[i * size:(i + 1) * size]

        wanted = [i for i in cache.missing(keys, need_hidden=True) if i * size >= begin]
        if wanted:
            hidden = torch.cat(computed)
            cache.insert(keys, {i: self._block(seq.slot, i, hidden[i * size - begin:(i + 1) * size - begin],
                                               records(i), top_n) for i in wanted})
        if top_n is not None:  # blocks it found without records at this top-N learn them
            cache.add_records(keys, records, top_n)

    def keep_retired(self, seq: Sequence) -> None:
        """As seq leaves its slot (which still holds its keys): its room is the cache's again,
        and the cache keeps the whole blocks of prompt and reply it computed (not the last
        token chosen: it was never fed back)."""
        cache = self.cache
        if cache is None:
            return
        cache.leaving(seq.num_tokens * self.kv.bytes_per_token)
        if self._cache_for(seq) is None or seq.num_computed < cache.block_size:
            return
        tokens = (seq.prompt_ids + seq.output_ids)[:seq.num_computed]
        keys = cache.keys(tokens, len(tokens) // cache.block_size, seq.params.cache_namespace)
        cache.insert(keys, {i: self._block(seq.slot, i, None) for i in cache.missing(keys, need_hidden=False)})

    def make_room(self, running: list[Sequence]) -> None:
        """Cached blocks make way for the running sequences' keys and values (one budget)."""
        if self.cache is not None:
            self.cache.make_room(sum(s.num_tokens for s in running) * self.kv.bytes_per_token)

    def _block(self, slot: int, index: int, hidden: torch.Tensor | None, records: list | None = None,
               records_top: int = 0) -> Block:
        k, v = self.kv.read_block(slot, index * self.cache.block_size, self.cache.block_size)
        return Block(k, v, None if hidden is None else hidden.clone(), records, records_top)
