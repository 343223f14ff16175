"""Receipts on replies (docs/receipts.md): one per choice, built from the choice's plan (prompt
ids and SamplingParams) and its deltas once it ends, in notary/receipts/format.py's shape. The
verifier re-executes one through the inverse here (sampling_params), so the two stay in step."""

import dataclasses
from collections.abc import Callable

from batchproof.engine.outputs import RequestOutput
from batchproof.engine.sampling.constraint import Constraint
from batchproof.engine.sampling.draws import STREAM
from batchproof.engine.sampling.logprobs import TokenRecord
from batchproof.engine.sampling.params import SamplingParams
from batchproof.notary.receipts.format import FLOAT_PARAMS, Entry, Outcome, PromptEntry, prompt_scoring, receipt
from batchproof.server.reply.weight_versions import reply_versions
from batchproof.server.request.plan import Plan

# (the model facts a receipt names: sha256, numerics_id, tokenizer_sha256, chat_template_sha256;
# the weight version serving as the reply ended)
Facts = Callable[[], tuple[dict, str]]


def params_json(params: SamplingParams) -> dict:
    """Every setting that decides a bit of the reply, and the stream a sampled one draws from,
    prompt scoring included (its records are bits the reply returns). Not the prefix cache's
    namespace: it changes no bit."""
    constraint = params.constraint
    return {
        "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p, "min_p": params.min_p,
        "repetition_penalty": params.repetition_penalty, "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "logit_bias": {str(token_id): bias for token_id, bias in sorted(params.logit_bias.items())},
        "seed": params.seed, "max_tokens": params.max_tokens, "min_tokens": params.min_tokens,
        "stop": list(params.stop), "ignore_eos": params.ignore_eos,
        "top_logprobs": params.top_logprobs, "tail_logprobs": params.tail_logprobs,
        "logprobs_mode": params.logprobs_mode,
        "constraint": None if constraint is None else {"kind": constraint.kind, "grammar": constraint.grammar},
        "generator": None if params.is_greedy else STREAM,
        "prompt_logprobs": params.prompt_logprobs,
        "prompt_logprob_token_ids": (None if params.prompt_logprob_token_ids is None
                                     else [list(row) for row in params.prompt_logprob_token_ids]),
        "prompt_logprob_start": params.prompt_logprob_start,
    }


def sampling_params(params: dict) -> SamplingParams:
    """A receipt's params as the engine runs them (the inverse of params_json); a ValueError
    (SamplingParamsError) names a setting out of range."""
    floats = {name: float(params[name]) for name in FLOAT_PARAMS if name != "logit_bias"}
    constraint = params["constraint"]
    scoring = prompt_scoring(params)
    return SamplingParams(
        **floats, top_k=params["top_k"], seed=params["seed"], max_tokens=params["max_tokens"],
        min_tokens=params["min_tokens"], stop=tuple(params["stop"]), ignore_eos=params["ignore_eos"],
        logit_bias={int(token_id): float(bias) for token_id, bias in params["logit_bias"].items()},
        top_logprobs=params["top_logprobs"], tail_logprobs=params["tail_logprobs"],
        logprobs_mode=params["logprobs_mode"],
        constraint=None if constraint is None else Constraint(constraint["kind"], constraint["grammar"]),
        prompt_logprobs=None if scoring is None else scoring[0],
        prompt_logprob_token_ids=None if scoring is None else scoring[1],
        prompt_logprob_start=0 if scoring is None else scoring[2],
    )


def entry(record: TokenRecord) -> Entry:
    return record.token_id, record.logprob, tuple((e.token_id, e.logprob) for e in record.top), record.tail


def prompt_entry(record: TokenRecord) -> PromptEntry:
    return (*entry(record), record.named)


def prompt_entries(records: list[TokenRecord | None] | None) -> tuple[PromptEntry, ...] | None:
    """A prompt's records (None first: nothing scores the first token) as a receipt digests them;
    None for a prompt never scored."""
    return None if records is None else tuple(prompt_entry(r) for r in records[1:])


def outcome_of(outputs: list[RequestOutput], wants_logprobs: bool,
               scored: list[TokenRecord | None] | None = None) -> Outcome:
    """A choice's deltas (in order, the last one final) as what it produced; `scored`: its
    prompt's records where another choice scored them (else its first delta's, if any)."""
    last = outputs[-1]
    entries = None
    if wants_logprobs:
        end = (entry(last.end_record),) if last.end_record is not None else ()
        entries = tuple(entry(r) for out in outputs for r in out.records) + end
    scored = scored if scored is not None else outputs[0].prompt_records
    return Outcome(tuple(t for out in outputs for t in out.token_ids), last.end_token_id, last.finish_reason,
                   last.num_output_tokens, entries, prompt_entries=prompt_entries(scored))


def choice_receipt(model: dict, prompt_ids: list[int], params: SamplingParams, outputs: list[RequestOutput],
                   scored: list[TokenRecord | None] | None = None) -> dict:
    versions = reply_versions(outputs).get("weight_version_spans", [])
    return receipt(model, versions, prompt_ids, params_json(params),
                   outcome_of(outputs, params.top_logprobs is not None, scored))


class ReceiptBook:
    """One request's receipts: its choices' deltas kept as they stream past, and each choice's
    receipt once it ends. The model facts are read once, when the first choice ends."""

    def __init__(self, plan: Plan, facts: Facts) -> None:
        self.plan = plan
        self._facts = facts
        self._model: tuple[dict, str] | None = None
        self._deltas: dict[int, list[RequestOutput]] = {}
        self._scored: dict[int, list[TokenRecord | None]] = {}  # per prompt, as its first choice scored it

    def add(self, index: int, out: RequestOutput) -> None:
        self._deltas.setdefault(index, []).append(out)

    def receipt(self, index: int, outputs: list[RequestOutput] | None = None) -> dict:
        """Choice `index`'s receipt, from `outputs` (a whole reply's) or the deltas add() kept."""
        outputs = outputs if outputs is not None else self._deltas.pop(index)
        if self._model is None:
            self._model = self._facts()
        model, serving = self._model
        versions = {span.version for out in outputs for span in out.weight_version_spans}
        if versions - {serving}:  # chosen by weights swapped out before the reply ended: no file to name
            model = {**model, "sha256": None}
        choice = self.plan.choices[index]
        # A prompt is scored once, by its first choice (the choices come in index order); its
        # siblings show the same records, so each one's receipt names and digests them too.
        first = next(c for c in self.plan.choices if c.prompt_index == choice.prompt_index)
        if outputs[0].prompt_records is not None:
            self._scored[choice.prompt_index] = outputs[0].prompt_records
        params = dataclasses.replace(choice.params, prompt_logprobs=first.params.prompt_logprobs)
        return choice_receipt(model, self.plan.prompt_ids(choice), params, outputs,
                              self._scored.get(choice.prompt_index))
