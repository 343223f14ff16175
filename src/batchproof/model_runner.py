"""Turning scheduled sequences into model inputs and logits (prefill and batched decode)."""

import torch

from batchproof.kv_cache import KVCache
from batchproof.logprobs import TokenRecord, build_records
from batchproof.model import Transformer
from batchproof.sequence import Sequence


class ModelRunner:
    def __init__(self, model: Transformer, cache: KVCache, max_batch: int, max_prefill_tokens: int) -> None:
        self.model = model
        self.cache = cache
        self.max_batch = max_batch
        self.max_prefill_tokens = max_prefill_tokens
        self.device = model.embed.device

    def prefill(self, seq: Sequence) -> tuple[torch.Tensor, list[TokenRecord | None] | None]:
        """Feed the whole prompt of one sequence -> (last position's logits [V], prompt records).

        Each prompt runs alone, in chunks whose bounds depend only on its own length, so a
        prompt's numbers are the same whoever else arrived with it. Prompt scoring turns
        each chunk's logits into records at once, so at most one chunk of logits is held.
        """
        ids = torch.tensor(seq.prompt_ids, dtype=torch.int64, device=self.device)
        top_n = seq.params.prompt_logprobs
        scored: list[TokenRecord | None] = [None]  # nothing predicts the first prompt token
        hidden = None
        for start in range(0, len(ids), self.max_prefill_tokens):
            hidden = self.model.prefill(ids[start:start + self.max_prefill_tokens], start, seq.slot, self.cache)
            if top_n is not None:
                targets = seq.prompt_ids[start + 1:start + 1 + len(hidden)]  # row i predicts token start+i+1
                logits = self.model.logits(hidden[:len(targets)]).cpu()
                scored += build_records(logits, targets, [top_n] * len(targets),
                                        list(range(start + 1, start + 1 + len(targets))))
        last = self.model.logits(hidden[-1:])[0].cpu()
        return last, (scored if top_n is not None else None)

    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One new token for each sequence, all in one forward pass -> logits [len(seqs), V]."""
        num_seqs = len(seqs)
        rows = self.model.decode_rows(num_seqs, self.max_batch)
        token_ids = torch.zeros(rows, dtype=torch.int64)
        positions = torch.zeros(rows, dtype=torch.int64)
        slots = torch.zeros(rows, dtype=torch.int64)
        token_ids[:num_seqs] = torch.tensor([s.output_ids[-1] for s in seqs])
        positions[:num_seqs] = torch.tensor([s.num_tokens - 1 for s in seqs])
        slots[:num_seqs] = torch.tensor([s.slot for s in seqs])
        hidden = self.model.decode(token_ids.to(self.device), positions.to(self.device), slots.to(self.device),
                                   num_seqs, self.cache)
        return self.model.logits(hidden)[:num_seqs].cpu()
