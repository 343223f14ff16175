"""The prefill route: a greedy reply's tokens are known, so one prefill of prompt + reply (+ its
end token) gives every position's logprobs and first maximum at once. That decides each bit of a
reply whose records and choice read the model's own row: greedy, no penalty or bias (they change
the row the choice reads, not the prefill's), no ban (ignore_eos, min_tokens), no stop string
(tokens it cut are in no receipt), no grammar, raw logprobs. Any other reply is generated again."""

from dataclasses import dataclass

from batchproof.engine.sampling.params import GREEDY_BELOW
from batchproof.notary.receipts.format import Entry, Outcome, prompt_scoring


@dataclass(frozen=True)
class ScoreJob:
    token_ids: list[int]  # prompt, reply, end token
    num_prompt: int
    num_alternatives: int  # at least 1: the first maximum is the greedy choice
    tails: bool


@dataclass(frozen=True)
class PromptJob:
    """A receipt's prompt scoring, on its own: the scored prompt's records depend on the prompt
    and these alone (raw rows; no sampling setting touches them)."""

    prompt_ids: list[int]
    num_alternatives: int
    tails: bool
    named: tuple[tuple[int, ...], ...] | None  # prompt_logprob_token_ids
    start: int  # prompt_logprob_start


def prompt_job(receipt: dict) -> PromptJob | None:
    """None for a receipt whose reply scored no prompt."""
    scoring = prompt_scoring(receipt["params"])
    if scoring is None:
        return None
    num_alternatives, named, start = scoring
    return PromptJob(receipt["prompt_token_ids"], num_alternatives, receipt["params"]["tail_logprobs"], named, start)


def is_scorable(receipt: dict) -> bool:
    p = receipt["params"]
    return (p["temperature"] < GREEDY_BELOW and p["repetition_penalty"] == 1.0 and p["presence_penalty"] == 0.0
            and p["frequency_penalty"] == 0.0 and not p["logit_bias"] and not p["ignore_eos"]
            and p["min_tokens"] == 0 and not p["stop"] and p["constraint"] is None
            and (p["top_logprobs"] is None or p["logprobs_mode"] == "raw"))


def score_job(receipt: dict) -> ScoreJob:
    prompt, end = receipt["prompt_token_ids"], receipt["end_token_id"]
    ids = [*prompt, *receipt["output_token_ids"], *([end] if end is not None else [])]
    top = receipt["params"]["top_logprobs"]
    return ScoreJob(ids, len(prompt), max(top or 0, 1), receipt["params"]["tail_logprobs"])


def _shown(scored: Entry, top: int, tails: bool) -> Entry:
    """A scored entry as the reply's record holds it: its first `top` alternatives, and with no
    alternative shown a tail of all the mass, logprob 0 exactly (as the engine writes it)."""
    token_id, logprob, alternatives, tail = scored
    return token_id, logprob, alternatives[:top], (0.0 if top == 0 else tail) if tails else None


def outcome_from_scores(receipt: dict, scored: list[Entry], max_model_len: int) -> Outcome:
    """What greedy decoding chooses along the receipt's tokens: each position's first maximum
    must be the receipt's token; the first that is not is where the re-executed reply turns off."""
    tokens, end = receipt["output_token_ids"], receipt["end_token_id"]
    params = receipt["params"]
    for position, (token_id, _, alternatives, _) in enumerate(scored):
        best = alternatives[0][0] if alternatives else None
        if best != token_id:  # greedy chooses `best` here: the reply goes another way from here on
            chosen = tuple(tokens[:position]) + ((best,) if best is not None else ())
            return Outcome(chosen, None, None, len(chosen), None)
    if end is not None:
        finish = "stop"
    elif len(tokens) == params["max_tokens"] or len(receipt["prompt_token_ids"]) + len(tokens) >= max_model_len:
        finish = "length"
    else:  # greedy decoding would not stop here: an abort is the only reason it did
        finish = "abort" if receipt["finish_reason"] == "abort" else None
    entries = None
    if params["top_logprobs"] is not None:
        entries = tuple(_shown(e, params["top_logprobs"], params["tail_logprobs"]) for e in scored)
    return Outcome(tuple(tokens), end, finish, len(tokens), entries)
