"""A Host in this process: an Engine loaded on the verifying machine. Replaying feeds each
receipt's prompt and reply in one prefill and checks every position's choice (replay.py); where
it cannot, scoring packs every job's prompt into the engine's prefill steps
(rollout_scoring.score_prompts), and generating runs the jobs together, as many at once as the
engine batches: a receipt's bits do not depend on its company."""

from batchproof.commands.receipts.replay import is_replayable, replay
from batchproof.commands.receipts.scoring import PromptJob, ScoreJob
from batchproof.engine.engine import Engine
from batchproof.engine.outputs import RequestOutput
from batchproof.engine.rollout_scoring import score_prompts
from batchproof.engine.sampling.params import SamplingParams
from batchproof.notary.receipts.format import Entry, Outcome, PromptEntry
from batchproof.server.reply.receipt import entry, outcome_of, prompt_entries, sampling_params
from batchproof.server.reply.receipt_facts import host_facts


class LocalHost:
    def __init__(self, engine: Engine, replays: bool = True) -> None:
        self.engine = engine
        # Replay needs rows whose bits do not depend on how their tokens were fed (our kernels);
        # `replays` False takes the other routes (the tests and the bench compare the two).
        self.replays = replays and engine.model.ops.reuses_prefixes

    def replay(self, receipts: list[dict]) -> list[Outcome | str | None]:
        """Each receipt re-executed along its own tokens at prefill speed (replay.py); None for
        those this route does not take (they are scored or generated)."""
        vocab = self.engine.tokenizer.vocab_size
        # A reply id outside the vocabulary cannot be fed: generated again, it is named a TOKEN.
        chosen = [i for i, r in enumerate(receipts) if self.replays and is_replayable(r)
                  and all(0 <= t < vocab for t in [*r["output_token_ids"], r["end_token_id"] or 0])]
        results: list[Outcome | str | None] = [None] * len(receipts)
        for i, outcome in zip(chosen, replay(self.engine, [receipts[i] for i in chosen])):
            results[i] = outcome
        return results

    def facts(self) -> dict:
        front = self.engine.front
        return host_facts(self.engine.info(), front.tokenizer, front.chat_template)

    def score(self, jobs: list[ScoreJob]) -> list[list[Entry] | str]:
        """Each job's reply positions (its end token's too) scored: (token, logprob, top, tail)."""
        prompts = [(job.token_ids, SamplingParams(temperature=0.0, max_tokens=0, prompt_logprobs=job.num_alternatives,
                                                  tail_logprobs=job.tails)) for job in jobs]
        results: list[list[Entry] | str] = []
        for job, scored in zip(jobs, score_prompts(self.engine, prompts)):
            results.append(scored if isinstance(scored, str) else [entry(r) for r in scored[job.num_prompt:]])
        return results

    def score_prompts(self, jobs: list[PromptJob]) -> list[tuple[PromptEntry, ...] | str]:
        prompts = [(job.prompt_ids, SamplingParams(temperature=0.0, max_tokens=0, prompt_logprobs=job.num_alternatives,
                                                   tail_logprobs=job.tails, prompt_logprob_token_ids=job.named,
                                                   prompt_logprob_start=job.start)) for job in jobs]
        return [scored if isinstance(scored, str) else prompt_entries(scored)
                for scored in score_prompts(self.engine, prompts)]

    def generate(self, jobs: list[tuple[list[int], dict]], max_in_flight: int | None = None) -> list[Outcome | str]:
        """Each (prompt ids, receipt params) generated again -> what it produced, or why it could not run."""
        engine = self.engine
        limit = max_in_flight or 4 * engine.config.max_batch
        results: list[Outcome | str | None] = [None] * len(jobs)
        for start in range(0, len(jobs), limit):
            deltas: dict[int, list[RequestOutput]] = {}
            wanted: dict[int, bool] = {}
            for index in range(start, min(start + limit, len(jobs))):
                prompt, params = jobs[index]
                try:
                    run = sampling_params(params)
                    engine.add_request(f"receipt-{index}", prompt, run)
                except ValueError as e:  # a setting out of range, a prompt this engine cannot take
                    results[index] = str(e)
                    continue
                deltas[index], wanted[index] = [], run.top_logprobs is not None
            while engine.has_work():
                for out in engine.step():
                    deltas[int(out.request_id.removeprefix("receipt-"))].append(out)
            for index, outputs in deltas.items():
                last = outputs[-1]
                results[index] = (f"generation failed: {last.error}" if last.finish_reason == "error"
                                  else outcome_of(outputs, wanted[index]))
        engine.take_batch_summary()
        return results  # type: ignore[return-value]  # every one is filled
