"""Logprobs as pure tensor functions: a fixed-order normaliser and top-k with exact ties.

These are the torch formulas; the compiled backend computes the same in one pass per row
(ops/kernel_ops.py), and its normaliser carries the kernels' tail. `build_records` takes whichever
the engine chose at load."""

from collections.abc import Callable
from dataclasses import dataclass

import torch

# The normaliser sums in chunks of this many logits, then sums the chunk totals: the
# same two reductions for every row, whatever the batch (torch splits one long row
# across threads when it is alone, and not when it has company).
NORMALIZER_CHUNK = 1024


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
    # Asked for only (None otherwise): the logprob of all the mass outside `top` (tail_logprobs),
    # and the logprobs of the tokens a teacher named for this row, in its order (-inf for -1).
    tail: float | None = None
    named: tuple[float, ...] | None = None

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


# (normaliser, top ids [B, k], num_shown [B]) -> [B]: each row's logprob outside its first num_shown ids.
TailFn = Callable[["Normalizer", torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Normalizer:
    """Each row's log-softmax as (term - shift) - log_total, evaluated only where asked:
    subtracting the max first keeps the sum's logarithm from vanishing next to a huge
    logit (two tied 1e30s get -log 2 each). A term is the logit (NaN as -inf), except in
    a row holding +inf: there its +inf entries share all the mass and the rest get none."""

    logits: torch.Tensor  # [B, V] float32
    row_max: torch.Tensor  # [B, 1] over non-NaN logits
    shift: torch.Tensor  # [B, 1]
    log_total: torch.Tensor  # [B, 1]
    # The tail's arithmetic, that of whoever summed log_total (None: tail_logprobs, these torch
    # formulas; the kernels' normaliser carries its ops' tail): a tail whose terms were summed by
    # another exp than log_total's would mix two numerics, and torch's exp is not the same on every host.
    tail_fn: TailFn | None = None

    @classmethod
    def from_parts(cls, logits: torch.Tensor, row_max: torch.Tensor, log_total: torch.Tensor,
                   tail_fn: TailFn | None = None) -> "Normalizer":
        return cls(logits, row_max, _shift(row_max), log_total, tail_fn)

    def rows(self, rows: list[int]) -> "Normalizer":
        """The normaliser of these rows only."""
        return Normalizer(self.logits[rows], self.row_max[rows], self.shift[rows], self.log_total[rows],
                          self.tail_fn)

    def tail(self, top_ids: torch.Tensor, num_shown: torch.Tensor) -> torch.Tensor:
        """[B] logprobs outside each row's first num_shown top ids, in this normaliser's arithmetic."""
        return (self.tail_fn or tail_logprobs)(self, top_ids, num_shown)

    def logprobs(self, token_ids: torch.Tensor) -> torch.Tensor:
        """[B, k] ids -> [B, k] logprobs."""
        return (_terms(self.logits.gather(-1, token_ids), self.row_max) - self.shift) - self.log_total


def _terms(values: torch.Tensor, row_max: torch.Tensor) -> torch.Tensor:
    clean = torch.where(values.isnan(), float("-inf"), values)
    has_inf = row_max == float("inf")
    return torch.where(has_inf, torch.where(clean == float("inf"), 0.0, float("-inf")), clean)


def _shift(row_max: torch.Tensor) -> torch.Tensor:
    return torch.where(row_max.isfinite(), row_max, torch.zeros_like(row_max))


def normalizer(logits: torch.Tensor) -> Normalizer:
    logits = logits.float()
    clean = torch.where(logits.isnan(), float("-inf"), logits)
    row_max = clean.amax(dim=-1, keepdim=True)  # exact, order-free
    shift = _shift(row_max)
    exps = (_terms(clean, row_max) - shift).exp()
    pad = -exps.shape[-1] % NORMALIZER_CHUNK
    if pad:
        exps = torch.nn.functional.pad(exps, (0, pad))  # zeros add nothing
    total = exps.unflatten(-1, (-1, NORMALIZER_CHUNK)).sum(-1).sum(-1, keepdim=True)  # [B, 1]
    return Normalizer(logits, row_max, shift, total.log())


def log_normalizer(logits: torch.Tensor) -> torch.Tensor:
    """logsumexp over each row's non-NaN logits: [B, V] -> [B]; stable for huge logits."""
    norm = normalizer(logits)
    return (norm.shift + norm.log_total).squeeze(-1)


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """[B, V] -> [B, V] logprobs, NaN entries as -inf, every row on its own fixed-order sums."""
    norm = normalizer(logits)
    return (_terms(norm.logits, norm.row_max) - norm.shift) - norm.log_total


def top_k_logprobs(logits: torch.Tensor, k: int) -> TopK:
    """The k best tokens of each row of [B, V] logits, with logit and logprob.

    NaN is never ranked; k is clamped to the number of non-NaN logits; among equal
    logits the lower id comes first.
    """
    return normalizer_and_top_k(logits, k)[1]


def normalizer_and_top_k(logits: torch.Tensor, k: int) -> tuple[Normalizer, TopK]:
    """normalizer() and top_k_logprobs() of the same logits, sharing the normaliser."""
    logits = logits.float()
    batch, vocab = logits.shape
    k = max(0, min(k, vocab))
    norm = normalizer(logits)
    nan = logits.isnan()
    counts = torch.clamp((~nan).sum(-1), max=k)
    if k == 0:
        empty = torch.empty(batch, 0)
        return norm, TopK(empty.long(), empty, empty, counts)
    clean = torch.where(nan, float("-inf"), logits)
    fast = _top_k_without_boundary_ties(clean, k)
    if fast is not None:
        return norm, TopK(fast[0], fast[1], norm.logprobs(fast[0]), counts)
    return norm, _top_k_exact(norm, clean, nan, k, counts)


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


def _top_k_exact(norm: Normalizer, clean: torch.Tensor, nan: torch.Tensor, k: int, counts: torch.Tensor) -> TopK:
    """Any rows, ties and NaNs included: every token at or above each row's k-th value is
    a candidate, so ties at the boundary are all present before they are ordered."""
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


def tail_logprobs(norm: Normalizer, top_ids: torch.Tensor, num_shown: torch.Tensor) -> torch.Tensor:
    """Per row, the logprob of the mass outside its first num_shown[r] top ids: [B] (-inf when
    they hold it all). Summed, not `1 - sum(top)`: next to a top of 0.9999 that subtraction
    keeps about three digits, this sum all of them. Its terms are the normaliser's, the shown
    ones zeroed, added in the normaliser's fixed order (chunks, then chunk totals), so a row's
    tail has the same bits alone or batched; it shares the entries' log_total."""
    exps = (_terms(norm.logits, norm.row_max) - norm.shift).exp()  # [B, V]
    k = top_ids.shape[-1]
    if k:
        shown = (torch.arange(k)[None, :] < num_shown[:, None]).int()  # [B, k]
        # Counted, not scattered as flags: a row with fewer than k candidates repeats an id past
        # its count, and two writes to one place would race.
        hits = torch.zeros_like(exps, dtype=torch.int32).scatter_add(-1, top_ids, shown)
        exps = torch.where(hits > 0, 0.0, exps)
    pad = -exps.shape[-1] % NORMALIZER_CHUNK
    if pad:
        exps = torch.nn.functional.pad(exps, (0, pad))
    outside = exps.unflatten(-1, (-1, NORMALIZER_CHUNK)).sum(-1).sum(-1)  # [B]
    # Nothing shown: the whole mass, logprob 0 exactly (not this sum's rounding against log_total).
    return torch.where(num_shown == 0, 0.0, outside.log() - norm.log_total.squeeze(-1))


def named_logprobs(norm: Normalizer, named_ids: list[tuple[int, ...]]) -> list[tuple[float, ...]]:
    """Each row's logprobs of the ids a caller named for it (vLLM's prompt_logprob_token_ids),
    in their order; -1 pads a short row and scores -inf, as vLLM's."""
    width = max(map(len, named_ids), default=0)
    if width == 0:
        return [() for _ in named_ids]
    ids = torch.tensor([list(row) + [-1] * (width - len(row)) for row in named_ids], dtype=torch.int64)
    values = torch.where(ids < 0, float("-inf"), norm.logprobs(ids.clamp(min=0))).tolist()
    return [tuple(values[r][:len(row)]) for r, row in enumerate(named_ids)]


def chosen_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """[B, V] logits and [B] chosen ids -> [B] logprobs of the chosen tokens."""
    return normalizer(logits).logprobs(token_ids[:, None]).squeeze(-1)


NormalizerAndTopK = Callable[[torch.Tensor, int], tuple[Normalizer, TopK]]


def build_records(logits: torch.Tensor, token_ids: list[int], top_ns: list[int], steps: list[int],
                  backend: NormalizerAndTopK = normalizer_and_top_k, with_tails: list[bool] | None = None,
                  named_ids: list[tuple[int, ...] | None] | None = None) -> list[TokenRecord]:
    """One record per row: the chosen token and the row's own top-N, from the same logits
    (`backend`: these torch formulas, or the engine's ops' one-pass kernel); where asked, the
    row's tail (with_tails[r], by the normaliser's own arithmetic: Normalizer.tail) and its named
    tokens' logprobs (named_ids[r])."""
    norm, top = backend(logits, max(top_ns, default=0))
    chosen = norm.logprobs(torch.tensor(token_ids, dtype=torch.int64)[:, None]).squeeze(-1).tolist()
    ids, top_logits, top_logprobs = top.ids.tolist(), top.logits.tolist(), top.logprobs.tolist()
    counts = top.counts.tolist()
    shown = [min(n, c) for n, c in zip(top_ns, counts)]
    tails: list[float | None] = [None] * len(token_ids)
    if with_tails is not None and any(with_tails):
        rows = [r for r, wanted in enumerate(with_tails) if wanted]
        values = norm.rows(rows).tail(top.ids[rows], torch.tensor([shown[r] for r in rows])).tolist()
        for r, value in zip(rows, values):
            tails[r] = value
    named: list[tuple[float, ...] | None] = [None] * len(token_ids)
    if named_ids is not None and any(row is not None for row in named_ids):
        rows = [r for r, row in enumerate(named_ids) if row is not None]
        for r, values in zip(rows, named_logprobs(norm.rows(rows), [named_ids[r] for r in rows])):
            named[r] = values
    records = []
    for r, (token_id, step) in enumerate(zip(token_ids, steps)):
        entries = tuple(TopEntry(ids[r][j], top_logits[r][j], top_logprobs[r][j]) for j in range(shown[r]))
        records.append(TokenRecord(step=step, token_id=token_id, logprob=chosen[r], top=entries,
                                   tail=tails[r], named=named[r]))
    return records
