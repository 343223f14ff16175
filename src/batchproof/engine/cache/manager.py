"""The cache manager (mini-sglang's CacheManager): one object owns the batch slots' KV regions
and the prefix cache, and answers every question about them.

A slot is taken and given back here only. Given back, the prefix cache first keeps the whole
blocks of prompt and reply its sequence computed, and the partial block after them, then the
slot's pages go back to the OS, before a newcomer given the slot writes it. Around a prompt's
prefill: at admission, what the cache holds of the prompt is copied into the slot; after it, the
prompt's new whole blocks are kept. A request with a cache_namespace of None neither reuses nor leaves prefixes; with
no prefix cache (off, or a backend that cannot promise the bits) only the slots are managed."""


import torch

from batchproof.engine.cache.kv_cache import KVCache
from batchproof.engine.cache.prefix_cache import Block, PrefixCache
from batchproof.engine.sampling.logprobs import TokenRecord
from batchproof.engine.sequence import Reused, Sequence


class CacheManager:
    def __init__(self, kv: KVCache, prefix_cache: PrefixCache | None) -> None:
        self.kv = kv
        # Replaced with the weights (engine.install_weights): its keys name the model that computed them.
        self.prefix_cache = prefix_cache
        self._free_slots: list[int] = list(range(kv.num_slots - 1, -1, -1))  # pop() hands out slot 0 first

    # --- slots -------------------------------------------------------------------------------

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    def take_slot(self, seq: Sequence) -> bool:
        """Give seq a free slot (False: none is free)."""
        if not self._free_slots:
            return False
        seq.slot = self._free_slots.pop()
        return True

    def admit(self, seq: Sequence) -> bool:
        """Give seq a free slot (False: none is free) and copy into it, now, what the cache holds
        of its prompt (kept on seq for its prefill): before this step's make_room, which makes way
        for the newcomers' own keys and values and could otherwise evict the very blocks they
        share (16 requests with a 400-token system prompt hold more than the default budget:
        each of them then prefilled it afresh)."""
        if not self.take_slot(seq):
            return False
        seq.reused = self.reuse(seq)
        return True

    def take_reused(self, seq: Sequence) -> Reused:
        """What admission copied into seq's slot for its prefill (asked again if it was dropped:
        a prefill started over after a keep swap), handed over once."""
        reused = seq.reused if seq.reused is not None else self.reuse(seq)
        seq.reused = None
        return reused

    def drop_reused(self, seq: Sequence) -> None:
        """What admission copied came from weights no longer served (a keep swap)."""
        seq.reused = None

    def to_be_stored(self, seq: Sequence, feeding: Sequence) -> int:
        """How many of seq's prompt tokens, beyond what the cache holds now, `feeding` (a prompt
        being prefilled, in the same namespace) will store when its prefill ends: the whole
        blocks their prompts share (0 where either neither reuses nor leaves prefixes)."""
        cache = self._cache_for(seq)
        if (cache is None or (seq.params.return_routed_experts and feeding.routes is None) or feeding.is_refilling
                or feeding.params.cache_namespace != seq.params.cache_namespace):
            return 0
        limit = min(len(seq.prompt_ids) - 1, len(feeding.prompt_ids))  # as reuse() and keep_prompt() go
        shared = 0
        while shared < limit and seq.prompt_ids[shared] == feeding.prompt_ids[shared]:
            shared += 1
        keys = cache.keys(seq.prompt_ids, shared // cache.block_size, seq.params.cache_namespace)
        missing = cache.missing(keys, need_hidden=False)  # a look: neither touched nor counted
        return (len(keys) - missing[0]) * cache.block_size if missing else 0

    def free_slot(self, seq: Sequence) -> None:
        """seq leaves its slot (one aborted while it waited never had one): the prefix cache
        keeps what it computed, the slot's pages go back to the OS, and the slot is free."""
        if seq.slot is None:
            return
        self._keep_retired(seq)
        self.kv.release(seq.slot)
        self._free_slots.append(seq.slot)
        seq.slot = None

    def make_room(self, running: list[Sequence]) -> None:
        """Cached blocks make way for the running sequences' keys and values (one budget)."""
        if self.prefix_cache is not None:
            self.prefix_cache.make_room(sum(s.num_tokens for s in running) * self.kv.bytes_per_token)

    # --- the prefix cache around a prefill ---------------------------------------------------

    def _cache_for(self, seq: Sequence) -> PrefixCache | None:
        return None if seq.params.cache_namespace is None else self.prefix_cache

    def reuse(self, seq: Sequence) -> Reused:
        """Before prefill: copy the cached blocks that open seq's prompt into its slot."""
        cache = self._cache_for(seq)
        if cache is None:
            return Reused()
        n, size, top_n = len(seq.prompt_ids), cache.block_size, seq.params.prompt_logprobs
        # The last prompt token is always computed: its logits choose the first reply token. A
        # request asking for its routing reuses only blocks that kept theirs (docs/moe.md).
        routed = seq.params.return_routed_experts
        blocks = cache.match(seq.prompt_ids, n - 1, need_hidden=top_n is not None,
                             namespace=seq.params.cache_namespace, need_routes=routed)
        begin = sum(block.num_tokens for block in blocks)  # whole blocks, then perhaps a tail
        seq.num_cached_tokens = begin
        for i, block in enumerate(blocks):
            self.kv.write_block(seq.slot, i * size, block.k, block.v)
        routes = torch.cat([block.routes for block in blocks]) if routed and blocks else None
        if top_n is None or not blocks:
            return Reused(begin, routes=routes)
        if seq.params.reuses_prompt_records and all(block.records is not None and block.records_top >= top_n
                                                    for block in blocks):
            # Kept where every block kept them at this top-N or more (the top-n of a row is the
            # first n of its top-N); the last target lies past the prefix: its row is scored.
            kept = [record for block in blocks for record in block.records][1:]  # target 0 has none
            kept = [TokenRecord(r.step, r.token_id, r.logprob, r.top[:top_n]) for r in kept]
            return Reused(begin, kept, [(begin - 1, blocks[-1].hidden[-1:])], routes)
        return Reused(begin, [], [(0, torch.cat([block.hidden for block in blocks]))], routes)

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

        routes = _routes(seq)
        wanted = [i for i in cache.missing(keys, need_hidden=True, need_routes=routes is not None) if i * size >= begin]
        if wanted:
            hidden = torch.cat(computed)
            cache.insert(keys, {i: self._block(seq.slot, i, hidden[i * size - begin:(i + 1) * size - begin],
                                               records(i), top_n, _rows(routes, i * size, size)) for i in wanted})
        if top_n is not None:  # blocks it found without records at this top-N learn them
            cache.add_records(keys, records, top_n)

    def _keep_retired(self, seq: Sequence) -> None:
        """As seq leaves its slot (which still holds its keys): its room is the cache's again,
        and the cache keeps the whole blocks of prompt and reply it computed, then the partial
        block after them (a conversation's next turn finds every position this one computed; not
        the last token chosen: it was never fed back)."""
        cache = self.prefix_cache
        if cache is None:
            return
        cache.leaving(seq.num_tokens * self.kv.bytes_per_token)
        if self._cache_for(seq) is None or seq.num_computed == 0:
            return
        size, namespace = cache.block_size, seq.params.cache_namespace
        tokens = (seq.prompt_ids + seq.output_ids)[:seq.num_computed]
        num_whole, tail = divmod(len(tokens), size)
        keys = cache.keys(tokens, num_whole, namespace)
        routes = _routes(seq)
        blocks = {i: self._block(seq.slot, i, None, routes=_rows(routes, i * size, size))
                  for i in cache.missing(keys, need_hidden=False, need_routes=routes is not None)}
        if tail and num_whole:  # stored with the whole blocks, so the prefix's touch orders it deepest
            keys.append(cache.tail_key(tokens, num_whole, tail, namespace, keys))
            if cache.missing(keys[-1:], need_hidden=False, need_routes=routes is not None):
                k, v = self.kv.read_block(seq.slot, num_whole * size, tail)
                blocks[num_whole] = Block(k, v, None, routes=_rows(routes, num_whole * size, tail))
        cache.insert(keys, blocks)

    def _block(self, slot: int, index: int, hidden: torch.Tensor | None, records: list | None = None,
               records_top: int = 0, routes: torch.Tensor | None = None) -> Block:
        size = self.prefix_cache.block_size
        k, v = self.kv.read_block(slot, index * size, size)
        return Block(k, v, None if hidden is None else hidden.clone(), records, records_top, routes)


def _routes(seq: Sequence) -> torch.Tensor | None:
    """The routes seq recorded [positions, MoE layers, k], position 0 on, or None (it asked for none)."""
    return torch.cat(seq.routes) if seq.routes else None


def _rows(routes: torch.Tensor | None, start: int, n: int) -> torch.Tensor | None:
    """Positions start..start+n of `routes`, or None where they do not reach that far (a block
    kept without routes: a routing request computes it again)."""
    return None if routes is None or len(routes) < start + n else routes[start:start + n].clone()
