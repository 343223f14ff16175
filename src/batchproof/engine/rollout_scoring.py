"""Rollouts re-scored by this engine: each rollout's prompt and completion as one prompt, scored
with no token generated, many of them in each prefill step (the scheduler packs them as it
packs any prompts, and a group's shared prompt comes from the prefix cache): per completion
token, its logprob and our top 2. The bits are those of generating the rollout here."""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from batchproof.engine.engine import Engine
from batchproof.engine.sampling.logprobs import TokenRecord
from batchproof.engine.sampling.params import SamplingParams

TOP = 2  # our best two per position: a near tie between them can flip a greedy choice anywhere

# What scoring asks: no token chosen (max_tokens 0), each prompt position scored with its top 2.
SCORING_PARAMS = SamplingParams(temperature=0.0, max_tokens=0, prompt_logprobs=TOP)
# A rollout that claims its MoE routing: scored the same, our routing of every position returned.
ROUTED_SCORING_PARAMS = dataclasses.replace(SCORING_PARAMS, return_routed_experts=True)


@dataclass(frozen=True)
class CompletionScores:
    logprobs: list[float]  # of each completion token
    top: list[tuple[tuple[int, float], ...]]  # per completion token, our (id, logprob) best first
    # Where asked (ROUTED_SCORING_PARAMS): our routing [positions][MoE layers][k] of every fed
    # position (prompt and completion but its last token), as the notary compares it.
    routes: list | None = None


def completion_scores(num_prompt: int, num_completion: int, records: list[TokenRecord | None],
                      routes: np.ndarray | None = None) -> CompletionScores:
    """The records of a scored prompt + completion -> the completion tokens' share (the record at
    position p scores token p from the logits of p - 1), and its routing receipt, if any."""
    mine = records[num_prompt:]
    if len(mine) != num_completion or any(r is None for r in mine):
        raise ValueError(f"{num_completion} completion tokens, {len(mine)} scored")
    return CompletionScores([r.logprob for r in mine], [tuple((e.token_id, e.logprob) for e in r.top) for r in mine],
                            None if routes is None else routes.tolist())


def replayed_params(claimed: np.ndarray) -> SamplingParams:
    """Scoring under a claimed routing (R3): its experts forced, the router's own choice returned
    (where they part: the notary's routing comparison), outside the prefix cache."""
    return dataclasses.replace(ROUTED_SCORING_PARAMS, forced_routes=claimed, cache_namespace=None)


def score_rollouts(engine: Engine, rollouts: list[tuple[list[int], list[int]]],
                   on_scored: Callable[[int], None] = lambda done: None,
                   max_in_flight: int | None = None, routed: frozenset[int] = frozenset(),
                   replayed: dict[int, np.ndarray] | None = None) -> list[CompletionScores | str]:
    """Each (prompt ids, completion ids) scored -> its scores, or why it could not be (a string:
    the engine's refusal or error). `on_scored(n)` as n more are done; at most `max_in_flight`
    queued at once (default: four batches' worth, enough to fill every prefill step). The
    rollouts numbered in `routed` also get our routing of them; those in `replayed` are scored
    under the routing given there (replayed_params)."""
    routes: dict[int, np.ndarray] = {}
    replayed = replayed or {}
    prompts = [(prompt + completion, replayed_params(replayed[i]) if i in replayed
                else ROUTED_SCORING_PARAMS if i in routed else SCORING_PARAMS)
               for i, (prompt, completion) in enumerate(rollouts)]
    scored = score_prompts(engine, prompts, on_scored, max_in_flight, routes)
    return [result if isinstance(result, str)
            else completion_scores(len(prompt), len(completion), result, routes.get(i))
            for i, ((prompt, completion), result) in enumerate(zip(rollouts, scored))]


def score_prompts(engine: Engine, prompts: list[tuple[list[int], SamplingParams]],
                  on_scored: Callable[[int], None] = lambda done: None,
                  max_in_flight: int | None = None, routes: dict[int, np.ndarray] | None = None
                  ) -> list[list[TokenRecord | None] | str]:
    """Each prompt scored under its params (max_tokens 0, prompt_logprobs set) -> its prompt
    records (None first: nothing comes before the first token), or why it could not be; into
    `routes`, by index, the routing receipt of each whose params asked for one."""
    limit = max_in_flight or 4 * engine.config.max_batch
    results: list[list[TokenRecord | None] | str | None] = [None] * len(prompts)
    records: dict[int, list] = {}
    pending = iter(enumerate(prompts))
    in_flight = 0

    def fill() -> None:
        nonlocal in_flight
        for index, (ids, params) in pending:
            try:
                engine.add_request(f"score-{index}", ids, params)
            except ValueError as e:  # the engine names what cannot run (a prompt past the context)
                results[index] = str(e)
                on_scored(1)
                continue
            in_flight += 1
            if in_flight >= limit:
                return

    fill()
    while in_flight:
        finished = 0
        for out in engine.step():
            index = int(out.request_id.removeprefix("score-"))
            if out.prompt_records is not None:  # on a request's first delta
                records[index] = out.prompt_records
            if out.finish_reason is None:
                continue
            finished += 1
            results[index] = out.error if out.error else records.pop(index, [])
            if routes is not None and out.routed_experts is not None:
                routes[index] = out.routed_experts
        in_flight -= finished
        if finished:
            on_scored(finished)
        fill()
    return results  # type: ignore[return-value]  # every one is filled
