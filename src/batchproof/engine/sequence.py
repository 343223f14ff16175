"""One request's state inside the engine (private to it: what it reports is outputs.py's RequestOutput)."""

import enum
import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from batchproof.engine.draft.drafter import Drafter
from batchproof.engine.grammar.state import GrammarState
from batchproof.engine.sampling.draws import Draws
from batchproof.engine.sampling.logprobs import TokenRecord
from batchproof.engine.sampling.params import SamplingParams
from batchproof.engine.text.text_stream import TextStream


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class PrefillProgress:
    """A prompt part-way through prefill: what the steps so far computed."""

    begin: int  # the first position computed (before it: blocks from the prefix cache)
    ids: torch.Tensor  # the prompt's ids [n]
    computed: list[torch.Tensor]  # the hidden rows of each chunk since `begin`
    scored: list  # prompt records so far (when prompt logprobs are asked for)


@dataclass
class Reused:
    """What the cache gave a prompt: its first num_tokens positions, now in the slot. For a
    request scoring its prompt, the records of the targets 1..num_tokens: the kept ones, then
    (first position, hidden rows [n, dim]) still to go through the LM head."""

    num_tokens: int = 0
    records: list[TokenRecord] = field(default_factory=list)
    unscored: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    # For a request asking for its routing: the experts the reused positions were routed to
    # [num_tokens, MoE layers, k], kept with the blocks by whichever request computed them.
    routes: torch.Tensor | None = None


@dataclass
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    text: TextStream
    draws: Draws | None  # a sampled request's stream (draws.py); None when greedy
    arrival_time: float = field(default_factory=time.monotonic)
    status: Status = Status.WAITING
    slot: int | None = None
    output_ids: list[int] = field(default_factory=list)
    output_counts: Counter[int] = field(default_factory=Counter)
    seen_ids: set[int] = field(default_factory=set)
    is_aborted: bool = False
    num_computed: int = 0  # leading positions whose keys and values are in the slot
    prefill: PrefillProgress | None = None  # while the prompt is part-way through prefill
    reused: Reused | None = None  # what the prefix cache gave it at admission, until its prefill starts
    num_cached_tokens: int = 0  # of the prompt's, copied from the prefix cache
    finish_reason: str | None = None
    error: str | None = None
    error_code: str | None = None  # RequestOutput.error_code
    logit_bias: torch.Tensor | None = None  # params.logit_bias as one row [V] (sampler.logit_bias_row)
    grammar: GrammarState | None = None  # under a constraint: its matcher and next mask
    drafter: Drafter | None = None  # its speculative drafts (None: speculation off)
    # After a keep-mode weight swap (docs/weight-versions.md): the prompt and the reply so far are
    # prefilled again under the new weights before it goes on, so no key mixes two models.
    is_refilling: bool = False
    # (index of the first output token a version chose, that version), in order; and how many
    # output tokens its deltas have released, where the next delta's spans begin.
    weight_versions: list[tuple[int, str]] = field(default_factory=list)
    num_released: int = 0
    # With params.return_routed_experts: the experts each fed position was routed to, chunks of
    # [positions, MoE layers, k] in position order (model/moe/receipt.py). The runner adds each
    # step's rows and cuts them back to what counts (keep_routes).
    routes: list[torch.Tensor] | None = None

    def __post_init__(self) -> None:
        self.seen_ids = set(self.prompt_ids)
        if self.params.return_routed_experts:
            self.routes = []

    def reuse_routes(self, routes: torch.Tensor) -> None:
        """The routing of the positions the prefix cache gave it (a request that asked for its
        routing reuses only blocks that kept theirs), before its prefill adds the rest."""
        if self.routes is not None:
            self.routes = [routes]

    def keep_routes(self, num_positions: int) -> None:
        """Only the first num_positions rows count: past them, rejected drafts' (speculation), or
        none at all after a keep swap (the refill routes every position again)."""
        if self.routes is not None and sum(len(rows) for rows in self.routes) > num_positions:
            self.routes = [torch.cat(self.routes)[:num_positions]]

    @property
    def num_tokens(self) -> int:
        """Positions in the KV cache once the last output token is fed back."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefill_ids(self) -> list[int]:
        """What prefill feeds: the prompt, or while refilling the prompt and the reply so far."""
        return self.prompt_ids + self.output_ids if self.is_refilling else self.prompt_ids

    @property
    def prefill_len(self) -> int:
        return len(self.prompt_ids) + (len(self.output_ids) if self.is_refilling else 0)

    @property
    def is_prefilling(self) -> bool:
        """Running, and its prompt (or, refilling, its prompt and reply) not yet fed whole."""
        return self.num_computed < self.prefill_len

    @property
    def is_finished(self) -> bool:
        """It has chosen its last token (outputs.py set why); the scheduler retires it next."""
        return self.finish_reason is not None

    @property
    def wants_records(self) -> bool:
        return self.params.top_logprobs is not None

    def append(self, token_id: int) -> None:
        self.output_ids.append(token_id)
        self.output_counts[token_id] += 1
        self.seen_ids.add(token_id)
