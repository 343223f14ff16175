"""Per-request sampling settings (no torch: the server builds these from JSON)."""

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from batchproof.engine.sampling.constraint import Constraint

GREEDY_BELOW = 1e-5  # a temperature under this samples greedily


class SamplingParamsError(ValueError):
    """A setting out of range; `param` names the field as the API spells it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise SamplingParamsError(param, message)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # None: no records kept; 0: the chosen token's logprob only; N: also the top N.
    top_logprobs: int | None = None
    # None: no prompt scoring; N: each prompt token's logprob and the top N before it.
    prompt_logprobs: int | None = None
    # vLLM's teacher scoring (needs prompt_logprobs): row i names the ids whose logprobs the
    # logits of position prompt_logprob_start + i give (they predict token start + i + 1); -1
    # pads a short row. One row per position from the start to the prompt's second-to-last.
    prompt_logprob_token_ids: tuple[tuple[int, ...], ...] | None = None
    prompt_logprob_start: int = 0
    # Each record also carries the logprob of the mass outside its top-N (TokenRecord.tail).
    tail_logprobs: bool = False
    # Which distribution the records describe: "raw" (after penalties and logit_bias, before the
    # bans, temperature and truncation) or "processed" (the one the token was chosen from).
    # Prompt records are always raw: no choice was made there.
    logprobs_mode: Literal["raw", "processed"] = "raw"
    # Whose cached prefixes this request may reuse, and under which name its own are kept: ""
    # is the shared namespace; None reuses nothing and keeps nothing. Not a sampling setting,
    # but it travels with the request wherever it runs (a fleet's replica too). The bits do not
    # depend on it: a hit in any namespace gives those of computing afresh.
    cache_namespace: str | None = ""
    # Structured output: each step's choice is made among the tokens this grammar allows.
    constraint: Constraint | None = None
    # A mixture of experts' routing receipt (docs/moe.md): the experts every fed position was
    # routed to, in each MoE layer, on the request's last output. Its prompt is then computed
    # whole, never read from the prefix cache (whose blocks keep keys, not routes).
    return_routed_experts: bool = False
    # Routing replay (R3): the experts each prompt position is routed to, [positions, MoE layers,
    # k] (a rollout's claimed routing, the notary's); positions past it route freely. Scoring only
    # (max_tokens 0), never through the prefix cache (cache_namespace None): its keys are not the
    # model's own routing's. Not compared (an array): two requests are alike whatever they force.
    forced_routes: np.ndarray | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check(0.0 <= self.temperature <= 2.0, "temperature", f"temperature must be in [0, 2], got {self.temperature}")
        _check(self.top_k >= 0, "top_k", f"top_k must be >= 0 (0 = off), got {self.top_k}")
        _check(0.0 < self.top_p <= 1.0, "top_p", f"top_p must be in (0, 1], got {self.top_p}")
        _check(0.0 <= self.min_p <= 1.0, "min_p", f"min_p must be in [0, 1], got {self.min_p}")
        _check(self.repetition_penalty > 0.0, "repetition_penalty",
               f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        _check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty",
               f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        _check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty",
               f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        # min/max, not a loop: a request's n choices each check a bias of up to the whole vocabulary.
        if self.logit_bias:
            worst = min(self.logit_bias.values()), max(self.logit_bias.values())
            _check(-100.0 <= worst[0] and worst[1] <= 100.0, "logit_bias",
                   f"logit_bias values must be in [-100, 100], got {worst[0] if worst[0] < -100.0 else worst[1]}")
        _check(self.seed is None or -(2**63) <= self.seed < 2**64, "seed",
               f"seed must fit in 64 bits, got {self.seed}")
        _check(self.max_tokens >= 0, "max_tokens", f"max_tokens must be >= 0, got {self.max_tokens}")
        _check(0 <= self.min_tokens <= max(self.max_tokens, 0), "min_tokens",
               f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop",
               f"stop strings must be non-empty, got {self.stop!r}")
        _check(self.top_logprobs is None or 0 <= self.top_logprobs, "top_logprobs",
               f"top_logprobs must be >= 0, got {self.top_logprobs}")
        _check(self.prompt_logprobs is None or 0 <= self.prompt_logprobs, "prompt_logprobs",
               f"prompt_logprobs must be >= 0, got {self.prompt_logprobs}")
        _check(self.prompt_logprob_token_ids is None or self.prompt_logprobs is not None, "prompt_logprob_token_ids",
               "prompt_logprob_token_ids needs prompt_logprobs (0 or more): the rows are prompt scoring's")
        _check(self.prompt_logprob_start >= 0, "prompt_logprob_start",
               f"prompt_logprob_start must be >= 0, got {self.prompt_logprob_start}")
        _check(self.prompt_logprob_token_ids is None or all(t >= -1 for row in self.prompt_logprob_token_ids
                                                            for t in row),
               "prompt_logprob_token_ids", "prompt_logprob_token_ids are token ids, or -1 to pad a row")
        _check(self.logprobs_mode in ("raw", "processed"), "logprobs_mode",
               f"logprobs_mode must be 'raw' or 'processed', got {self.logprobs_mode!r}")
        _check(self.forced_routes is None or (self.forced_routes.ndim == 3 and self.max_tokens == 0
                                              and self.cache_namespace is None), "forced_routes",
               "forced_routes is a [positions, MoE layers, k] array, for scoring alone (max_tokens 0) outside "
               "the prefix cache (cache_namespace None)")

    @property
    def is_greedy(self) -> bool:
        # As vLLM reads it: below this, dividing by the temperature only overflows.
        return self.temperature < GREEDY_BELOW

    @property
    def reuses_prompt_records(self) -> bool:
        """Whether cached prompt records serve this request: not when it wants what they did
        not keep (a tail, named tokens), which its rows are scored afresh for."""
        return self.prompt_logprob_token_ids is None and not self.tail_logprobs

    def named_ids_at(self, step: int) -> tuple[int, ...] | None:
        """The ids named for the row whose target is prompt position `step`, if any."""
        if self.prompt_logprob_token_ids is None:
            return None
        row = step - 1 - self.prompt_logprob_start
        return self.prompt_logprob_token_ids[row] if 0 <= row < len(self.prompt_logprob_token_ids) else None

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0 or bool(self.logit_bias))
