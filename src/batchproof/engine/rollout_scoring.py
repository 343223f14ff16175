"""Rollouts re-scored by this engine: each rollout's prompt and completion as one prompt, scored
with no token generated, many of them in each prefill step (the scheduler packs them as it
packs any prompts, and a group's shared prompt comes from the prefix cache): per completion
token, its logprob and our top 2. The bits are those of generating the rollout here."""

from collections.abc import Callable
from dataclasses import dataclass

from batchproof.engine.engine import Engine
from batchproof.engine.sampling.logprobs import TokenRecord
from batchproof.engine.sampling.params import SamplingParams

TOP = 2  # our best two per position: a near tie between them can flip a greedy choice anywhere

# What scoring asks: no token chosen (max_tokens 0), each prompt position scored with its top 2.
SCORING_PARAMS = SamplingParams(temperature=0.0, max_tokens=0, prompt_logprobs=TOP)


@dataclass(frozen=True)
class CompletionScores:
    logprobs: list[float]  # of each completion token
    top: list[tuple[tuple[int, float], ...]]  # per completion token, our (id, logprob) best first


def completion_scores(num_prompt: int, num_completion: int, records: list[TokenRecord | None]) -> CompletionScores:
    """The records of a scored prompt + completion -> the completion tokens' share (the record at
    position p scores token p from the logits of p - 1)."""
    mine = records[num_prompt:]
    if len(mine) != num_completion or any(r is None for r in mine):
        raise ValueError(f"{num_completion} completion tokens, {len(mine)} scored")
    return CompletionScores([r.logprob for r in mine], [tuple((e.token_id, e.logprob) for e in r.top) for r in mine])


def score_rollouts(engine: Engine, rollouts: list[tuple[list[int], list[int]]],
                   on_scored: Callable[[int], None] = lambda done: None,
                   max_in_flight: int | None = None) -> list[CompletionScores | str]:
    """Each (prompt ids, completion ids) scored -> its scores, or why it could not be (a string:
    the engine's refusal or error). `on_scored(n)` as n more are done; at most `max_in_flight`
    queued at once (default: four batches' worth, enough to fill every prefill step)."""
    scored = score_prompts(engine, [(prompt + completion, SCORING_PARAMS) for prompt, completion in rollouts],
                           on_scored, max_in_flight)
    return [result if isinstance(result, str) else completion_scores(len(prompt), len(completion), result)
            for (prompt, completion), result in zip(rollouts, scored)]


def score_prompts(engine: Engine, prompts: list[tuple[list[int], SamplingParams]],
                  on_scored: Callable[[int], None] = lambda done: None,
                  max_in_flight: int | None = None) -> list[list[TokenRecord | None] | str]:
    """Each prompt scored under its params (max_tokens 0, prompt_logprobs set) -> its prompt
    records (None first: nothing comes before the first token), or why it could not be."""
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
        in_flight -= finished
        if finished:
            on_scored(finished)
        fill()
    return results  # type: ignore[return-value]  # every one is filled
