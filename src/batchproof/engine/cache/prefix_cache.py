"""The prefix cache: keys and values of token prefixes already computed, reused bit for bit.

Why reuse changes no bit: with our kernels a position's keys, values and final hidden
state are a function of the tokens up to it alone (every kernel works one row at a time,
attention included; `Ops.reuses_prefixes`), so they are the same bits whichever request
computed them, in whatever chunk, by prefill or by decode. Backends without that
property (torch, whose BLAS blocks a row by the row count) do not get a cache.

A block holds `block_size` consecutive positions and is keyed by a hash of every token up
to its end, chained from a seed naming the model and its arithmetic, so a key names one
prefix of one model. A sequence that leaves also keeps its last, partial block (a tail of
1..block_size-1 positions after at least one whole block, keyed apart from whole blocks): the
next turn of a conversation then finds every position the previous turn computed, not only its
whole blocks. Blocks are copied into a sequence's own slot at admission (and out
of it after prefill and at retirement): a running sequence never reads the cache, so
eviction can never pull a block from under it. Why copies and not a paged cache: a copy
of a 1,000-token prefix is ~46 MB for the default model, a few milliseconds against the
seconds its prefill costs, and it leaves every kernel as it is (docs/prefix-cache.md).
"""

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass

import torch

# The share of its budget the cache keeps however much the running sequences hold: they may
# outgrow the budget (none is refused for it), and a cache left no room then loses the prefixes
# those very sequences share (a system prompt under load), so each newcomer prefills it afresh.
KEPT_SHARE = 4  # a quarter
RECORD_BYTES, ENTRY_BYTES = 200, 160  # a TokenRecord with its floats, and each TopEntry with its own (~180, ~130)


@dataclass
class Block:
    k: torch.Tensor  # [layers, kv_heads, block_size, head_dim]
    v: torch.Tensor
    hidden: torch.Tensor | None  # [block_size, dim] after the final norm, for prompt logprobs; None if decode made it
    # Prompt records whose targets are this block's positions (the first block's first is
    # None: nothing predicts token 0), at top-N `records_top`: a request scoring the same
    # prefix at that top-N or less reads them instead of running the LM head again.
    records: list | None = None
    records_top: int = 0
    # The experts each of its positions was routed to [num_tokens, MoE layers, k] (an MoE model's
    # routing receipt), where a request that computed them asked: a request asking for its
    # routing reuses only blocks that have it. Routing, like keys and values, is a function of the
    # tokens up to a position alone, so the kept routes are the ones computing again would give.
    routes: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.k.shape[2]  # block_size, or fewer for a tail

    @property
    def nbytes(self) -> int:
        parts = tuple(t for t in (self.k, self.v, self.hidden, self.routes) if t is not None)
        tensors = sum(t.numel() * t.element_size() for t in parts)
        # Records are Python objects: counted at a generous estimate of their size.
        records = sum(RECORD_BYTES + ENTRY_BYTES * len(r.top) for r in self.records or () if r is not None)
        return tensors + records


@dataclass
class PrefixCacheStats:
    """The cache's counters, each counted by the cache itself as it happens (/metrics reads them)."""

    queried_tokens: int = 0  # prompt tokens looked up (match)
    hit_tokens: int = 0  # of those, served from the cache
    inserted_blocks: int = 0
    evicted_blocks: int = 0


class PrefixCache:
    def __init__(self, block_size: int, budget_bytes: int, identity: str) -> None:
        self.block_size = block_size
        self.budget_bytes = budget_bytes
        self._seed = hashlib.blake2b(identity.encode(), digest_size=16).digest()
        # Least recently used first. A prefix is touched from its last block to its first,
        # so eviction takes the deepest blocks first and never strands a reachable tail.
        self._blocks: OrderedDict[bytes, Block] = OrderedDict()
        self.nbytes = 0
        self.live_bytes = 0  # the running sequences' keys and values: the budget is shared
        self.stats = PrefixCacheStats()

    def __len__(self) -> int:
        return len(self._blocks)

    def _namespace_seed(self, namespace: str) -> bytes:
        return self._seed if not namespace else hashlib.blake2b(self._seed + namespace.encode(),
                                                                digest_size=16).digest()

    def keys(self, token_ids: list[int], num_blocks: int, namespace: str = "") -> list[bytes]:
        """The keys of the first num_blocks full blocks of token_ids, in `namespace` (a request's
        cache_namespace): the same tokens in two namespaces are two unrelated chains."""
        keys, key, size = [], self._namespace_seed(namespace), self.block_size
        for i in range(num_blocks):
            key = hashlib.blake2b(key + array("q", token_ids[i * size:(i + 1) * size]).tobytes(),
                                  digest_size=16).digest()
            keys.append(key)
        return keys

    def tail_key(self, token_ids: list[int], num_blocks: int, length: int, namespace: str = "",
                 keys: list[bytes] | None = None) -> bytes:
        """The key of the tail of `length` positions after the first num_blocks whole blocks
        (`keys`: those blocks' keys, if already computed). Marked apart from a whole block's key,
        so a tail never stands for a whole block of the same tokens' first positions."""
        keys = self.keys(token_ids, num_blocks, namespace) if keys is None else keys
        parent = keys[num_blocks - 1] if num_blocks else self._namespace_seed(namespace)
        start = num_blocks * self.block_size
        return hashlib.blake2b(b"tail" + parent + array("q", token_ids[start:start + length]).tobytes(),
                               digest_size=16).digest()

    def match(self, token_ids: list[int], limit: int, need_hidden: bool, namespace: str = "",
              need_routes: bool = False) -> list[Block]:
        """The cached blocks that open token_ids in `namespace`, covering at most `limit` tokens
        (and, when asked, only blocks that kept their hidden states, or their routes): whole
        blocks, then the longest tail that follows them, if one is held (tails have no hidden
        states). Counted: all of token_ids looked up, the blocks' tokens served."""
        keys = self.keys(token_ids, limit // self.block_size, namespace)
        found: list[Block] = []
        for key in keys:
            block = self._blocks.get(key)
            if block is None or (need_hidden and block.hidden is None) or (need_routes and block.routes is None):
                break
            found.append(block)
        used = keys[:len(found)]
        # A tail only follows a whole block: below 16 tokens nothing is shared (a one-token tail
        # would make every prompt opening with a common word a hit, and say so in cached_tokens).
        if found and not need_hidden:
            start = len(found) * self.block_size
            for length in range(min(self.block_size - 1, limit - start), 0, -1):
                key = self.tail_key(token_ids, len(found), length, namespace, keys)
                if key in self._blocks and not (need_routes and self._blocks[key].routes is None):
                    found.append(self._blocks[key])
                    used.append(key)
                    break
        self._touch(used)
        self.stats.queried_tokens += len(token_ids)
        self.stats.hit_tokens += sum(block.num_tokens for block in found)
        return found

    def missing(self, keys: list[bytes], need_hidden: bool, need_routes: bool = False) -> list[int]:
        """Indices of keys not held (or held without hidden states, or routes, when they are wanted)."""
        return [i for i, key in enumerate(keys)
                if key not in self._blocks or (need_hidden and self._blocks[key].hidden is None)
                or (need_routes and self._blocks[key].routes is None)]

    def insert(self, keys: list[bytes], blocks: dict[int, Block]) -> None:
        """Store blocks[i] under keys[i] (a block already held is kept, its hidden states
        added if it lacked them), then touch the whole prefix keys[0..]."""
        for i, block in sorted(blocks.items()):
            old = self._blocks.get(keys[i])
            if old is not None:
                if old.hidden is None and block.hidden is not None:
                    block.routes = block.routes if block.routes is not None else old.routes
                    self.nbytes += block.nbytes - old.nbytes
                    self._blocks[keys[i]] = block
                elif old.routes is None and block.routes is not None:  # held without them: it learns them
                    old.routes = block.routes
                    self.nbytes += block.routes.numel() * block.routes.element_size()
                continue
            if block.nbytes > self.room:
                return
            self._blocks[keys[i]] = block
            self.nbytes += block.nbytes
            self.stats.inserted_blocks += 1
        self._touch(keys)
        self._evict(keep=keys)

    def add_records(self, keys: list[bytes], records_of, top_n: int) -> None:
        """Give held blocks records_of(i) where they have none at top-N `top_n` or more."""
        for i, key in enumerate(keys):
            block = self._blocks.get(key)
            if block is not None and block.hidden is not None and (block.records is None
                                                                    or block.records_top < top_n):
                before = block.nbytes
                block.records, block.records_top = records_of(i), top_n
                self.nbytes += block.nbytes - before
        self._evict(keep=keys)

    def _touch(self, keys: list[bytes]) -> None:
        for key in reversed(keys):
            if key in self._blocks:
                self._blocks.move_to_end(key)

    def make_room(self, live_bytes: int) -> None:
        """The running sequences now hold live_bytes of keys and values: cached blocks make
        way for them (vLLM's rule: a cached block is a free block until it is needed), so
        the cache and the live sequences together stay within the budget; where the live ones
        alone need more, the cache keeps its most recent quarter of it (KEPT_SHARE)."""
        self.live_bytes = live_bytes
        self._evict(keep=[])

    def leaving(self, nbytes: int) -> None:
        """A sequence leaves its slot, its keys and values no longer live (and its blocks may
        now take their room)."""
        self.live_bytes = max(0, self.live_bytes - nbytes)

    @property
    def room(self) -> int:
        return max(self.budget_bytes // KEPT_SHARE, self.budget_bytes - self.live_bytes)

    def _evict(self, keep: list[bytes]) -> None:
        """Least recently used first, until within budget; the prefix just stored goes last."""
        if self.nbytes <= self.room:
            return
        protected = set(keep)
        victims = [key for key in self._blocks if key not in protected] + [k for k in reversed(keep)
                                                                           if k in self._blocks]
        for key in victims:
            if self.nbytes <= self.room:
                break
            self.nbytes -= self._blocks.pop(key).nbytes
            self.stats.evicted_blocks += 1

    def info(self) -> dict:
        return {"block_size": self.block_size, "budget_bytes": self.budget_bytes, "bytes": self.nbytes,
                "blocks": len(self._blocks), "live_bytes": self.live_bytes}
