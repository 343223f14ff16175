"""A Host in this process: an Engine loaded on the verifying machine. Scoring packs every job's
prompt into the engine's prefill steps (rollout_scoring.score_prompts); generating runs the jobs
together, as many at once as the engine batches: a receipt's bits do not depend on its company."""

from batchproof.commands.receipts.scoring import ScoreJob
from batchproof.engine.engine import Engine
from batchproof.engine.outputs import RequestOutput
from batchproof.engine.rollout_scoring import score_prompts
from batchproof.engine.sampling.params import SamplingParams
from batchproof.notary.receipts.format import Entry, Outcome
from batchproof.server.reply.receipt import entry, outcome_of, sampling_params
from batchproof.server.reply.receipt_facts import host_facts


class LocalHost:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

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
