"""After the forward pass: choose each row's token, record its logprobs, advance or finish
its sequence, and say what it produced (RequestOutput, what the engine reports: a delta per
step; the server reads these, never a Sequence). Pure bookkeeping over the step's logits."""

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from batchproof.engine.grammar.state import GrammarFailure
from batchproof.engine.sampling.logprobs import NormalizerAndTopK, TokenRecord, build_records
from batchproof.engine.sampling.sampler import (
    NEG_INF,
    FirstMax,
    SampleRow,
    SamplingError,
    apply_penalties,
    banned_for_step,
    choose_and_process,
    greedy_tokens,
    processed_logits,
)
from batchproof.engine.sequence import Sequence
from batchproof.engine.text.text_stream import TextDelta


@dataclass
class RequestOutput:
    """A delta: the text, token ids and records released by one step, and how the request ended."""

    request_id: str
    text: str
    records: list[TokenRecord]
    num_prompt_tokens: int
    num_output_tokens: int
    finish_reason: str | None = None  # "stop", "length", "abort" or "error"
    error: str | None = None
    # What kind of error: "grammar_exhausted" is the request's own (its grammar and its min_tokens
    # or ignore_eos left no token), so the server answers 400; None is the server's (500).
    error_code: str | None = None
    prompt_records: list[TokenRecord | None] | None = None  # echo scoring, on the first delta
    num_kept_tokens: int = 0  # output tokens whose bytes reach the reply (all, unless a stop string cut)
    num_cached_tokens: int = 0  # prompt tokens whose keys and values came from the prefix cache
    # The ids of the tokens whose text this delta releases, always (records only with logprobs):
    # over a request's deltas they number num_kept_tokens, in the places the records take.
    token_ids: list[int] = field(default_factory=list)
    # Speculative decoding, so far: tokens drafted for this request, and of those, emitted.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # The end-of-turn/EOS token that ended the reply (finish_reason "stop" without a stop string),
    # on the last delta: no part of the text, its record (with logprobs) kept so a trainer can
    # train on the decision to stop. Not counted in num_output_tokens nor num_kept_tokens.
    end_token_id: int | None = None
    end_record: TokenRecord | None = None
    # Which weights chose the tokens (docs/weight-versions.md): the version that chose this
    # delta's last token (with none: the version serving when it was made), and the versions of
    # its token_ids as spans indexed over the reply's tokens, so a stream's spans join end to end.
    weight_version: str = ""
    weight_version_spans: list["VersionSpan"] = field(default_factory=list)
    # With params.return_routed_experts, on the last delta only: the experts each fed position
    # (prompt, then reply but its last token) was routed to, [positions, MoE layers, k] (moe/receipt.py).
    routed_experts: np.ndarray | None = None


@dataclass(frozen=True)
class VersionSpan:
    """Reply tokens start..end-1 (end excluded) were chosen by the weights labelled `version`."""

    start: int
    end: int
    version: str


@dataclass
class _Choice:
    token_id: int | None
    record: TokenRecord | None
    error: str | None = None
    error_code: str | None = None  # RequestOutput.error_code
    processed: torch.Tensor | None = None  # the processed row the choice was drawn from, where its record wants it


def _rows(logits: torch.Tensor, rows: list[torch.Tensor], index: list[int]) -> torch.Tensor:
    """rows[j] (logits[index[j]], or a changed copy of it) as one [len, V] tensor: the step's
    logits themselves when no row changed and all are asked for, else one gather; a stack only
    where penalties or a grammar changed a row. The same values either way (nothing is computed),
    without copying every row a step at a 262k vocabulary (1 MB each)."""
    if all(row.data_ptr() == logits[i].data_ptr() for row, i in zip(rows, index)):
        return logits if index == list(range(len(logits))) else logits[index]
    return torch.stack(rows)


class OutputProcessor:
    """Turns one step's logits into tokens, records and RequestOutputs. A sequence it ends is
    FINISHED and its output carries a finish_reason: the engine, which holds the live requests,
    forgets it from that output (this class keeps no table of them)."""

    def __init__(self, end_ids: frozenset[int], max_model_len: int, records_backend: NormalizerAndTopK,
                 greedy_backend: FirstMax, sample_backend: SampleRow, grammar_mask_timeout_s: float) -> None:
        self.end_ids = end_ids
        self.max_model_len = max_model_len
        # The engine's ops (kernel or torch, chosen at load) for the records and the greedy choice.
        self.records_backend = records_backend
        self.greedy_backend = greedy_backend
        self.sample_backend = sample_backend  # a sampled choice and its distribution (sampler.SampleRow)
        self.num_tokens = 0  # tokens appended since the last take_num_tokens()
        self.grammar_wait_s = 0.0  # how long steps waited for grammar masks (the bench reads it)
        # The longest one step waits for all its rows' masks together: a stuck grammar worker
        # delays the batch by this once, then only its rows fail.
        self.grammar_mask_timeout_s = grammar_mask_timeout_s

    def process(self, seqs: list[Sequence], logits: torch.Tensor, prompt_records: list) -> list[RequestOutput]:
        """logits [len(seqs), V]: the next token of each scheduled sequence."""
        return self._emit(seqs, self._sample_and_record(seqs, logits), prompt_records)

    def take_num_tokens(self) -> int:
        n, self.num_tokens = self.num_tokens, 0
        return n

    def _sample_and_record(self, seqs: list[Sequence], logits: torch.Tensor) -> list[_Choice]:
        rows = [apply_penalties(logits[i], s.params, s.seen_ids, s.output_counts, s.logit_bias)
                for i, s in enumerate(seqs)]
        banned = [banned_for_step(s.params, self.end_ids, len(s.output_ids)) for s in seqs]
        allowed, failures = self._grammar_masks(seqs)
        # The choice reads the grammar's mask; raw records read the row before it (the model's own
        # distribution), processed ones the masked row renormalised over the allowed tokens.
        masked = [row if mask is None else torch.where(mask.to(row.device), row, NEG_INF)
                  for row, mask in zip(rows, allowed)]
        choices = self._choose(seqs, logits, masked, banned, failures)
        # Records read the same logits the choice read, after it: asking for them changes nothing.
        wanted = [i for i, (s, c) in enumerate(zip(seqs, choices)) if s.wants_records and c.token_id is not None]
        if wanted:
            recorded = [rows[i] if seqs[i].params.logprobs_mode != "processed" else
                        choices[i].processed if choices[i].processed is not None else
                        processed_logits(masked[i], seqs[i].params, banned[i], self.sample_backend) for i in wanted]
            records = build_records(
                _rows(logits, recorded, wanted),
                [choices[i].token_id for i in wanted],
                [seqs[i].params.top_logprobs for i in wanted],
                [len(seqs[i].output_ids) for i in wanted],
                self.records_backend,
                [seqs[i].params.tail_logprobs for i in wanted],
            )
            for i, record in zip(wanted, records):
                if record.logprob != record.logprob:  # NaN: the normaliser saw no finite logit
                    choices[i] = _Choice(None, None, f"step {record.step}: logprobs are not finite")
                elif allowed[i] is not None and seqs[i].params.logprobs_mode == "processed":
                    # Processed under a grammar: alternatives among the allowed tokens only.
                    top = tuple(entry for entry in record.top if entry.logprob != NEG_INF)
                    choices[i].record = dataclasses.replace(record, top=top)
                else:
                    choices[i].record = record
        return choices

    def _grammar_masks(self, seqs: list[Sequence]) -> tuple[list[torch.Tensor | None], dict[int, _Choice]]:
        """Each constrained sequence's allowed tokens (None: unconstrained), and the rows whose
        grammar failed or whose mask came too late (only those rows end; the batch goes on).
        Per sequence, never per batch: a row's mask is the same alone or batched."""
        allowed: list[torch.Tensor | None] = [None] * len(seqs)
        failures: dict[int, _Choice] = {}
        started = time.perf_counter()
        deadline = started + self.grammar_mask_timeout_s
        for i, seq in enumerate(seqs):
            if seq.grammar is not None:  # (none for a prompt scored with max_tokens 0)
                try:
                    allowed[i] = seq.grammar.allowed(max(0.0, deadline - time.perf_counter()))
                except GrammarFailure as e:
                    failures[i] = _Choice(None, None, f"step {len(seq.output_ids)}: {e}", e.code)
        self.grammar_wait_s += time.perf_counter() - started
        return allowed, failures

    def _choose(self, seqs: list[Sequence], logits: torch.Tensor, rows: list[torch.Tensor],
                banned: list[frozenset[int]], failures: dict[int, _Choice]) -> list[_Choice]:
        choices: list[_Choice] = []
        # Greedy rows (the common case) are chosen in one pass; sampled ones one by one.
        plain = [i for i, s in enumerate(seqs) if s.params.is_greedy and s.params.max_tokens and i not in failures]
        greedy = {}
        if plain:
            picks = greedy_tokens(_rows(logits, [rows[i] for i in plain], plain), [banned[i] for i in plain],
                                  self.greedy_backend)
            greedy = dict(zip(plain, picks))
        for i, (seq, row) in enumerate(zip(seqs, rows)):
            step = len(seq.output_ids)
            if seq.params.max_tokens == 0:  # prompt scoring only
                choices.append(_Choice(None, None))
            elif i in failures:
                choices.append(failures[i])
            elif i in greedy:
                token_id = greedy[i]
                choices.append(_Choice(token_id, None) if token_id is not None else
                               self._nothing_allowed(seq, banned[i], step))
            else:
                try:
                    # A processed record reads the distribution this draw was made from: one pass for both.
                    processed = seq.wants_records and seq.params.logprobs_mode == "processed"
                    chosen, kept = choose_and_process(row, seq.params, banned[i], seq.draws, self.sample_backend,
                                                      processed)
                    choices.append(_Choice(chosen, None, processed=kept))
                except SamplingError:
                    choices.append(self._nothing_allowed(seq, banned[i], step))
                except RuntimeError as e:  # this request fails; the batch goes on
                    choices.append(_Choice(None, None, f"step {step}: {e}"))
        return choices

    @staticmethod
    def _nothing_allowed(seq: Sequence, banned: frozenset[int], step: int) -> _Choice:
        if seq.grammar is None:
            return _Choice(None, None, f"step {step}: no token can be chosen: every logit is NaN, -inf or banned")
        why = (" (it allows only the end of the reply, which min_tokens or ignore_eos forbids here)"
               if banned else " (every token it allows has a NaN or -inf logit)")
        return _Choice(None, None, f"step {step}: the grammar allows no token here{why}", "grammar_exhausted")

    def _emit(self, seqs: list[Sequence], choices: list[_Choice], prompt_records: list) -> list[RequestOutput]:
        outputs = []
        for seq, choice, scored in zip(seqs, choices, prompt_records):
            if choice.error is not None:
                seq.error, seq.error_code, seq.finish_reason = choice.error, choice.error_code, "error"
                outputs.append(self._finish(seq, TextDelta()))
                continue
            if choice.token_id is None:  # max_tokens == 0
                seq.finish_reason = "length"
                out = self._finish(seq, TextDelta())
            elif choice.token_id in self.end_ids:  # the end of the turn is not part of the reply
                seq.finish_reason = "stop"
                out = self._finish(seq, TextDelta())
                # ...but it was chosen like any token: its id and record travel beside the reply.
                out.end_token_id, out.end_record = choice.token_id, choice.record
            else:
                try:
                    if seq.grammar is not None:
                        seq.grammar.advance(choice.token_id)
                except GrammarFailure as e:
                    seq.error, seq.error_code, seq.finish_reason = f"step {len(seq.output_ids)}: {e}", e.code, "error"
                    outputs.append(self._finish(seq, TextDelta()))
                    continue
                out = self._advance(seq, choice)
            out.prompt_records = scored
            outputs.append(out)
        return outputs

    def _advance(self, seq: Sequence, choice: _Choice) -> RequestOutput:
        seq.append(choice.token_id)
        self.num_tokens += 1
        delta = seq.text.add(choice.token_id, choice.record)
        if seq.text.is_stopped:
            seq.finish_reason = "stop"
        elif seq.grammar is not None and seq.grammar.is_stopped:  # complete: it takes no further token
            if banned_for_step(seq.params, self.end_ids, len(seq.output_ids)):  # but the reply may not end yet
                seq.error, seq.error_code, seq.finish_reason = (
                    f"step {len(seq.output_ids)}: the grammar is complete, and min_tokens or ignore_eos forbids "
                    "ending the reply here", "grammar_exhausted", "error")
            else:
                seq.finish_reason = "stop"
        elif len(seq.output_ids) >= seq.params.max_tokens or seq.num_tokens >= self.max_model_len:
            # As vLLM counts it: prompt and reply together fill at most max_model_len positions.
            seq.finish_reason = "length"
        if seq.finish_reason is not None:
            return self._finish(seq, delta)
        return self._output(seq, delta)

    def _finish(self, seq: Sequence, delta: TextDelta) -> RequestOutput:
        tail = seq.text.finish() if seq.error is None else TextDelta()
        if seq.grammar is not None:  # a mask begun for a token that will never come
            seq.grammar.cancel()
        return self._output(seq, TextDelta(delta.text + tail.text, delta.records + tail.records,
                                           delta.token_ids + tail.token_ids))

    def _output(self, seq: Sequence, delta: TextDelta) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id, text=delta.text, records=delta.records, token_ids=delta.token_ids,
            num_prompt_tokens=len(seq.prompt_ids), num_output_tokens=len(seq.output_ids),
            finish_reason=seq.finish_reason, error=seq.error, error_code=seq.error_code,
            num_kept_tokens=seq.text.num_kept_tokens, num_cached_tokens=seq.num_cached_tokens,
            num_draft_tokens=seq.drafter.num_proposed if seq.drafter else 0,
            num_accepted_tokens=seq.drafter.num_accepted if seq.drafter else 0,
        )

    def fail(self, seq: Sequence, message: str) -> RequestOutput:
        """End a sequence whose step raised (the runner has discarded what its slot holds, so none
        of it reaches the prefix cache when the scheduler retires it)."""
        finished_inside = seq.is_finished  # it finished inside the failed step, whose outputs are lost
        seq.error, seq.finish_reason = message, "error"
        if finished_inside:
            return self._output(seq, TextDelta())
        return self._finish(seq, TextDelta())

    def retired(self, retired: list[Sequence]) -> list[RequestOutput]:
        return [self.ended_early(seq) for seq in retired if seq.is_aborted and seq.finish_reason is None]

    def ended_early(self, seq: Sequence) -> RequestOutput:
        """An abort (or a replay whose known tokens run out: replay.py) ends the reply as max_tokens
        would there: the text a stop string (or an unfinished character) held back goes out, with
        its tokens' ids and records, so the reply's entries number its tokens and it is the reply
        so far, not a shorter one."""
        seq.finish_reason = "abort"
        return self._finish(seq, TextDelta())
