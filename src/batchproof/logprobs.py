"""Logprobs as pure tensor functions: a fixed-order normaliser and top-k with exact ties."""

from dataclasses import dataclass

import torch

# The normaliser sums in chunks of this many logits, then sums the chunk totals: the
# same two reductions for every row, whatever the batch (torch splits one long row
# across threads when it is alone, and not when it has company).
NORMALIZER_CHUNK = 1024
ABSENT_LOGPROB = -9999.0  # OpenAI's spelling of log(0) on the wire


@dataclass(frozen=True, slots=True)
class TopEntry:
    token_id: int
    logit: float
    logprob: float


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """What one generated (or scored) token's logits said, read before sampling touched them."""

    step: int
    token_id: int
    logprob: float
    top: tuple[TopEntry, ...]

    @property
    def top2_margin(self) -> float | None:
        return self.top[0].logit - self.top[1].logit if len(self.top) >= 2 else None


@dataclass(frozen=True)
class TopK:
    """Per row: the best k tokens, best first, ties to the lower id; `counts[r]` are valid."""

    ids: torch.Tensor  # [B, k] int64
    logits: torch.Tensor  # [B, k]
    logprobs: torch.Tensor  # [B, k]
    counts: torch.Tensor  # [B] int64, k clamped to the row's non-NaN logits


@dataclass(frozen=True)
class Normalizer:
    """Each row's log-softmax, kept as (terms - shift) - log_total and evaluated only where
    asked: subtracting the max first keeps the sum's logarithm from vanishing next to a
    huge logit (two tied 1e30s get -log 2 each)."""

    clean: torch.Tensor  # [B, V] the logits with NaN as -inf: what ranking reads
    terms: torch.Tensor  # [B, V] what the softmax reads (clean, unless the row holds +inf)
    shift: torch.Tensor  # [B, 1]
    log_total: torch.Tensor  # [B, 1]

    def logprobs(self, token_ids: torch.Tensor) -> torch.Tensor:
        """[B, k] ids -> [B, k] logprobs."""
        return (self.terms.gather(-1, token_ids) - self.shift) - self.log_total


def normalizer(logits: torch.Tensor) -> Normalizer:
    """NaN counts as absent. A row holding +inf gives its +inf entries all the mass,
    shared equally, and every other entry none."""
    clean = torch.where(logits.isnan(), float("-inf"), logits.float())
    row_max = clean.amax(dim=-1, keepdim=True)  # exact, order-free
    has_inf = row_max == float("inf")
    terms = clean
    if bool(has_inf.any()):
        terms = torch.where(has_inf, torch.where(clean == float("inf"), 0.0, float("-inf")), clean)
    shift = torch.where(has_inf, 0.0, torch.where(row_max.isfinite(), row_max, 0.0))
    exps = (terms - shift).exp()
    pad = -exps.shape[-1] % NORMALIZER_CHUNK
    if pad:
        exps = torch.nn.functional.pad(exps, (0, pad))  # zeros add nothing
    total = exps.unflatten(-1, (-1, NORMALIZER_CHUNK)).sum(-1).sum(-1, keepdim=True)  # [B, 1]
    return Normalizer(clean, terms, shift, total.log())


def log_normalizer(logits: torch.Tensor) -> torch.Tensor:
    """logsumexp over each row's non-NaN logits: [B, V] -> [B]; stable for huge logits."""
    norm = normalizer(logits)
    return (norm.shift + norm.log_total).squeeze(-1)


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """[B, V] -> [B, V] logprobs, NaN entries as -inf, every row on its own fixed-order sums."""
    norm = normalizer(logits)
    return (norm.terms - norm.shift) - norm.log_total


def top_k_logprobs(logits: torch.Tensor, k: int, norm: Normalizer | None = None) -> TopK:
    """The k best tokens of each row of [B, V] logits, with logit and logprob.

    NaN is never ranked; k is clamped to the number of non-NaN logits; among equal
    logits the lower id comes first.
    """
    batch, vocab = logits.shape
    k = max(0, min(k, vocab))
    nan = logits.isnan()
    counts = torch.clamp((~nan).sum(-1), max=k)
    if k == 0:
        empty = torch.empty(batch, 0)
        return TopK(empty.long(), empty, empty, counts)
    norm = norm or normalizer(logits)
    fast = _top_k_without_boundary_ties(norm.clean, k)
    if fast is not None:
        return TopK(fast[0], fast[1], norm.logprobs(fast[0]), counts)
    return _top_k_exact(norm, nan, k, counts)


def _top_k_without_boundary_ties(clean: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The common case, cheaply: when no row's k-th value ties with its (k+1)-th, torch's
    topk holds exactly the right tokens; only ties inside them need ordering by id.
    None when some row ties across the boundary (or holds fewer than k + 1 finite values)."""
    vocab = clean.shape[-1]
    if k >= vocab:
        return None
    values, ids = clean.topk(k + 1, dim=-1)  # best first
    if not bool((values[:, k - 1] > values[:, k]).all()):
        return None
    values, ids = values[:, :k], ids[:, :k]
    # Stable sorts: by id, then by value (descending); ties end up in ascending id order.
    by_id = ids.sort(dim=-1, stable=True).indices
    ids, values = ids.gather(-1, by_id), values.gather(-1, by_id)
    by_value = values.sort(dim=-1, descending=True, stable=True).indices
    return ids.gather(-1, by_value), values.gather(-1, by_value)


def _top_k_exact(norm: Normalizer, nan: torch.Tensor, k: int, counts: torch.Tensor) -> TopK:
    """Any rows, ties and NaNs included: every token at or above each row's k-th value is
    a candidate, so ties at the boundary are all present before they are ordered."""
    clean = norm.clean
    batch = clean.shape[0]
    threshold = clean.topk(k, dim=-1).values[:, -1:]
    candidates = clean >= threshold
    if bool((threshold == float("-inf")).any()):  # NaN (as -inf) must not pass as a candidate
        candidates &= ~nan
    rows, cols = candidates.nonzero(as_tuple=True)  # row-major, ids ascending
    if cols.numel() == 0:  # every logit NaN in every row
        ids = torch.zeros(batch, k, dtype=torch.int64)
        return TopK(ids, torch.full((batch, k), float("nan")), torch.full((batch, k), float("nan")), counts)
    values = clean[rows, cols]
    # Two stable sorts: by value (descending), then by row; ids stay ascending among ties.
    order = values.sort(descending=True, stable=True).indices
    order = order[rows[order].sort(stable=True).indices]
    rows, cols, values = rows[order], cols[order], values[order]
    per_row = torch.bincount(rows, minlength=batch)
    starts = torch.cumsum(per_row, 0) - per_row
    take = starts[:, None] + torch.arange(k)[None, :]  # [B, k]
    take = torch.minimum(take, (starts + per_row - 1).clamp(min=0)[:, None])
    ids = cols[take]
    return TopK(ids, values[take], norm.logprobs(ids), counts)


def chosen_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, norm: Normalizer | None = None) -> torch.Tensor:
    """[B, V] logits and [B] chosen ids -> [B] logprobs of the chosen tokens."""
    return (norm or normalizer(logits)).logprobs(token_ids[:, None]).squeeze(-1)


def build_records(logits: torch.Tensor, token_ids: list[int], top_ns: list[int], steps: list[int]) -> list[TokenRecord]:
    """One record per row: the chosen token and the row's own top-N, from the same logits."""
    norm = normalizer(logits)
    top = top_k_logprobs(logits, max(top_ns, default=0), norm)
    chosen = chosen_logprobs(logits, torch.tensor(token_ids, dtype=torch.int64), norm).tolist()
    ids, top_logits, top_logprobs = top.ids.tolist(), top.logits.tolist(), top.logprobs.tolist()
    counts = top.counts.tolist()
    records = []
    for r, (token_id, n, step) in enumerate(zip(token_ids, top_ns, steps)):
        entries = tuple(
            TopEntry(ids[r][j], top_logits[r][j], top_logprobs[r][j]) for j in range(min(n, counts[r]))
        )
        records.append(TokenRecord(step=step, token_id=token_id, logprob=chosen[r], top=entries))
    return records
