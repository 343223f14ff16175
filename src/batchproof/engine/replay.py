"""Re-execution at prefill speed: a reply whose tokens are known is fed once, prompt and reply,
and the engine's own OutputProcessor reads each reply position's logits row in order, one position
at a time, as decode steps read them: penalties and bias over the tokens so far, the bans of
min_tokens and ignore_eos, the grammar's mask, the seed's next draw (draws.py) through the engine's
sampler, the records, stop strings and the end. The same code and the same rows (with our kernels a
position's row has the same bits however its tokens were fed: a prefill chunk or a decode step, the
invariant speculative decoding and the prefix cache rest on), so the same bits as generating again;
a position whose choice is not the known token ends that reply there, as the draws of speculative
verification do. A reply that scored its prompt (prompt_logprobs, echo) has its prompt's records
built from the same prefill's rows, as the runner scores a prompt chunk by chunk, and sent on its
first output as the engine sends them. The receipts' verifier (commands/receipts/replay.py) is its
caller; a reply a stop string cut, and the torch path (whose rows depend on how tokens were fed),
are generated again there."""

import dataclasses
from collections import Counter

import torch

from batchproof.engine.engine import Engine
from batchproof.engine.grammar.state import GrammarState
from batchproof.engine.memory import prefill_heap
from batchproof.engine.model.transformer import Segment
from batchproof.engine.outputs import RequestOutput
from batchproof.engine.runner import score_prompt_rows
from batchproof.engine.sampling.draws import Draws
from batchproof.engine.sampling.logprobs import TokenRecord
from batchproof.engine.sampling.params import SamplingParams
from batchproof.engine.sampling.sampler import apply_penalties, banned_for_step, logit_bias_row, processed_logits
from batchproof.engine.sequence import Sequence
from batchproof.engine.text.text_stream import TextStream

NEG_INF = float("-inf")


@dataclasses.dataclass(frozen=True)
class Known:
    """A reply to re-execute: its prompt, its sampling settings, and the token each reply position
    must choose (the reply's tokens, then its end token where it had one)."""

    prompt_ids: list[int]
    params: SamplingParams
    wanted: list[int]


@dataclasses.dataclass
class Replayed:
    """What the known inputs produced, up to the first position whose choice differs (included)."""

    outputs: list[RequestOutput]
    seed_differs: bool  # a choice differed where the known token had a chance: only the draw chose otherwise


@dataclasses.dataclass
class _Job:
    index: int
    seq: Sequence
    fed: list[int]  # prompt + the reply's tokens but the last row's
    wanted: list[int]  # the token each row must choose: the reply's, then its end token
    logits: torch.Tensor | None = None  # [rows, V]: row j chooses wanted[j]
    scored: list[TokenRecord | None] | None = None  # its prompt's records (None first), where it scores them
    outputs: list[RequestOutput] = dataclasses.field(default_factory=list)
    seed_differs: bool = False


def replay(engine: Engine, known: list[Known]) -> list[Replayed | str]:
    """What each known reply's inputs produce on `engine` (idle), its choice checked at each reply
    position, or a string saying why it could not run (a refusal a new request would meet)."""
    results: list[Replayed | str | None] = [None] * len(known)
    jobs: list[_Job] = []
    for index, reply in enumerate(known):
        try:
            jobs.append(_job(engine, index, reply))
        except ValueError as e:  # a setting out of range, a prompt this engine cannot take
            results[index] = str(e)
    engine.reap()  # the slots of requests that ended since the last step, given back as a step would
    if engine.has_work():
        raise RuntimeError("replies are replayed on an idle engine: requests are running or waiting")
    caches = engine.caches
    if jobs and not caches.num_free_slots:
        raise RuntimeError("the engine has no free slot")
    while jobs:
        group, jobs = jobs[:caches.num_free_slots], jobs[caches.num_free_slots:]
        for job in group:
            caches.take_slot(job.seq)
        try:
            engine.share_cores()  # the cores free now, as a step takes them
            # From the heap, as the engine's prefill steps allocate: the activations, and each
            # position's [jobs, V] rows, would otherwise each be mapped afresh (page faults cost
            # the int8 route more than its sampling did).
            with torch.inference_mode(), prefill_heap():
                _prefill(engine, group)
                for job in group:
                    if job.seq.grammar is not None:
                        job.seq.grammar.start()
                _choose(engine, group)
        finally:
            for job in group:
                engine.runner.discard(job.seq)  # nothing of it counts (nor reaches the prefix cache)
                caches.free_slot(job.seq)
        for job in group:
            results[job.index] = Replayed(job.outputs, job.seed_differs)
    engine.outputs.take_num_tokens()
    return results  # type: ignore[return-value]  # every one is filled


def _job(engine: Engine, index: int, reply: Known) -> _Job:
    fed = [*reply.prompt_ids, *reply.wanted[:-1]]
    if len(fed) > engine.max_model_len:
        raise ValueError(f"the prompt and reply have {len(fed)} tokens; the context holds {engine.max_model_len}")
    request_id = f"replay-{index}"
    engine.check_request(request_id, reply.prompt_ids, reply.params)  # the refusals generating it would meet
    return _Job(index, _sequence(engine, request_id, reply.prompt_ids, reply.params), fed, list(reply.wanted))


def _sequence(engine: Engine, request_id: str, prompt: list[int], params: SamplingParams) -> Sequence:
    """A sequence as Engine.add_request makes it (its stream, bias row and grammar), not queued."""
    tokenizer = engine.tokenizer
    draws = Draws(params.seed) if not params.is_greedy else None  # a sampled reply always names its seed
    grammar = GrammarState(tokenizer, params.constraint.grammar) if params.constraint is not None else None
    return Sequence(request_id, list(prompt), params, TextStream(tokenizer, params.stop), draws,
                    logit_bias=logit_bias_row(params.logit_bias, tokenizer.vocab_size), grammar=grammar)


def _prefill(engine: Engine, group: list[_Job]) -> None:
    """Every job's fed tokens through the model, packed as the scheduler packs prompts (at most
    max_prefill_tokens a call, several prompts a call where the model batches prefill); the LM
    head then runs on each job's reply rows only."""
    model, kv, size = engine.model, engine.caches.kv, engine.config.max_prefill_tokens
    hidden: dict[int, list[torch.Tensor]] = {id(job): [] for job in group}
    pending = [(job, 0) for job in group]
    while pending:
        call: list[tuple[_Job, int, int]] = []
        budget = size
        while pending and budget > 0:
            job, at = pending.pop(0)
            n = min(budget, len(job.fed) - at)
            call.append((job, at, n))
            budget -= n
            if at + n < len(job.fed):
                pending.insert(0, (job, at + n))
            if not model.ops.batches_prefill:
                break
        segments = [Segment(torch.tensor(job.fed[at:at + n], dtype=torch.int64, device=model.device), at,
                            job.seq.slot) for job, at, n in call]
        rows = model.prefill(segments, kv)
        for (job, at, n), part in zip(call, rows.split([n for _, _, n in call])):
            if job.seq.params.prompt_logprobs is not None:
                job.scored = (job.scored or [None]) + _score(engine, job.seq, at, part)
            first = len(job.seq.prompt_ids) - 1  # the prompt's last position chooses the first token
            if at + n > first:
                hidden[id(job)].append(part[max(0, first - at):])
    for job in group:
        job.logits = model.logits(torch.cat(hidden[id(job)])).cpu()


def _score(engine: Engine, seq: Sequence, start: int, rows: torch.Tensor) -> list[TokenRecord]:
    """The prompt positions these rows predict, scored as the runner scores a prefill chunk: the
    same rows, the same function."""
    return score_prompt_rows(engine.model, seq, start, rows)


def _choose(engine: Engine, group: list[_Job]) -> None:
    """Row j of every job still matching, read by the engine's OutputProcessor as step j of
    decoding reads it; a job stops where its choice is not the known token or its reply ends."""
    active, at = list(group), 0
    while active:
        rows = torch.stack([job.logits[at] for job in active])
        going = []
        scored = [job.scored if at == 0 else None for job in active]  # on a reply's first output
        for job, out in zip(active, engine.outputs.process([job.seq for job in active], rows, scored)):
            job.outputs.append(out)
            seq = job.seq
            chosen = _chosen(seq, out)
            if chosen is not None and chosen != job.wanted[at]:
                job.seed_differs = _possible(engine, job, at)
            if not seq.is_finished and chosen == job.wanted[at] and at + 1 < len(job.wanted):
                going.append(job)
        active, at = going, at + 1
    for job in group:  # unfinished where the known tokens end or part: what it holds back goes out
        if not job.seq.is_finished:
            job.outputs.append(engine.outputs.ended_early(job.seq))


def _chosen(seq: Sequence, out: RequestOutput) -> int | None:
    """The token this step chose: the end token, or the one it appended; None on an error."""
    if out.end_token_id is not None:
        return out.end_token_id
    return None if out.finish_reason == "error" else seq.output_ids[-1]


def _possible(engine: Engine, job: _Job, at: int) -> bool:
    """Whether the known token at `at` had a chance under the distribution re-executed there
    (the same penalties, bans and sampling settings over the same tokens): then only the draw
    chose otherwise, and the seed (or the stream) is what differs."""
    seq, params = job.seq, job.seq.params
    if seq.draws is None or seq.grammar is not None:  # no draw chose it (or a mask this does not rebuild)
        return False
    before = job.wanted[:at]
    row = apply_penalties(job.logits[at], params, set(seq.prompt_ids) | set(before), Counter(before),
                          seq.logit_bias)
    banned = banned_for_step(params, engine.end_ids, at)
    kept = processed_logits(row, params, banned, engine.model.ops.sample)
    return bool(kept[job.wanted[at]] > NEG_INF)
