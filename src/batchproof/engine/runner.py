"""Turning scheduled sequences into model inputs and logits (prefill and batched decode)."""

import torch

from batchproof.engine.kv_cache import KVCache
from batchproof.engine.logprobs import TokenRecord, build_records
from batchproof.engine.model.transformer import Segment, Transformer
from batchproof.engine.sequence import Sequence


class ModelRunner:
    def __init__(self, model: Transformer, cache: KVCache, max_batch: int, max_prefill_tokens: int) -> None:
        self.model = model
        self.cache = cache
        self.max_batch = max_batch
        self.max_prefill_tokens = max_prefill_tokens
        self.device = model.device

    def prefill(self, seqs: list[Sequence]) -> list[tuple[torch.Tensor, list[TokenRecord | None] | None]]:
        """Feed the prompts of newly admitted sequences -> per sequence, (its last position's
        logits [V], its prompt records or None).

        Each prompt is cut into chunks at bounds that depend only on its own length; where
        the model can share a call without changing a bit (`batches_prefill`), the chunks of
        every newcomer go through together, else one prompt at a time. Prompt scoring turns
        each chunk's logits into records at once, so at most one chunk of logits is held.
        """
        groups = [seqs] if self.model.ops.batches_prefill else [[seq] for seq in seqs]
        results: dict[int, tuple] = {}
        for group in groups:
            ids = {id(s): torch.tensor(s.prompt_ids, dtype=torch.int64, device=self.device) for s in group}
            scored: dict[int, list] = {id(s): [None] for s in group}  # nothing predicts a first token
            last_hidden: dict[int, torch.Tensor] = {}
            longest = max(len(s.prompt_ids) for s in group)
            for start in range(0, longest, self.max_prefill_tokens):
                active = [s for s in group if start < len(s.prompt_ids)]
                segments = [Segment(ids[id(s)][start:start + self.max_prefill_tokens], start, s.slot) for s in active]
                hidden = self.model.prefill(segments, self.cache)
                for seq, rows in zip(active, hidden.split([len(seg.token_ids) for seg in segments])):
                    last_hidden[id(seq)] = rows[-1:]
                    if seq.params.prompt_logprobs is not None:
                        scored[id(seq)] += self._score(seq, start, rows)
            last_logits = self.model.logits(torch.cat([last_hidden[id(s)] for s in group])).cpu()
            for seq, logits in zip(group, last_logits):
                results[id(seq)] = (logits, scored[id(seq)] if seq.params.prompt_logprobs is not None else None)
        return [results[id(seq)] for seq in seqs]

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
        return self.model.logits(hidden)[:num_seqs].cpu()
