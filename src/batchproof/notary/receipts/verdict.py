"""A receipt held to this host and to its re-execution: MATCH, or which input differs (in the
receipt's terms) and the first output position where the re-executed reply differs. Each kind is
an exit code scripts can read (docs/receipts.md)."""

import enum
from dataclasses import dataclass

from batchproof.notary.receipts import prompt_view
from batchproof.notary.receipts.format import Outcome, checksum, params_checksum
from batchproof.notary.receipts.reply_view import ReplyView, first_difference, wire_entries


class Kind(enum.IntEnum):
    """What differs, first found first; the value is verify-receipt's exit code."""

    MATCH = 0
    BAD_RECEIPT = 2  # unreadable, or a field missing or of the wrong type
    WEIGHTS = 3  # model.sha256 (or the reply spans weights no longer served)
    NUMERICS = 4  # model.numerics_id
    TOKENIZER = 5  # model.tokenizer_sha256
    TEMPLATE = 6  # model.chat_template_sha256
    PARAMS = 7  # params (the seed among them): edited since the reply
    PROMPT = 8  # prompt_token_ids: edited since the reply
    TOKEN = 9  # an output token (or where the reply ends) is not what re-execution chose
    LOGPROB = 10  # a logprob's bits (a reply token's, or a scored prompt position's)
    UNVERIFIABLE = 11  # this host refused to run it (a context too short, a grammar over --url)


@dataclass(frozen=True)
class Verdict:
    kind: Kind
    field: str | None  # the receipt's (or the reply's) name for what differs
    # The first output position where the re-executed reply differs (its tokens, the end token
    # counted after them; else a logprob entry where the reply shows them); for a scored prompt's
    # logprob (field prompt_logprobs_sha256, or the reply's prompt_logprobs, echoed entries or
    # prompt_token_id_logprobs) the prompt position instead; None when it does not, or where no
    # position can be named (a digest alone differs).
    position: int | None
    message: str

    def as_json(self) -> dict:
        return {"verdict": self.kind.name, "exit_code": int(self.kind), "field": self.field,
                "position": self.position, "message": self.message}


def _short(value: object) -> str:
    text = str(value)
    return text[:16] + "..." if len(text) > 19 else text


def _edited(receipt: dict) -> tuple[Kind, str, str] | None:
    sums = receipt["checksums"]
    if params_checksum(receipt["params"]) != sums["params"]:
        return Kind.PARAMS, "params", "the params (seed and sampling settings) are not those the receipt was made with"
    if checksum(receipt["prompt_token_ids"]) != sums["prompt_token_ids"]:
        return Kind.PROMPT, "prompt_token_ids", "the prompt ids are not those the receipt was made with"
    return None


def _facts(receipt: dict, host: dict) -> tuple[Kind, str, str] | None:
    model = receipt["model"]
    versions = {span["version"] for span in receipt["weight_versions"]}
    if model["sha256"] is None or len(versions) > 1:
        return (Kind.WEIGHTS, "weight_versions", f"the reply's tokens were chosen by weights {sorted(versions)} no "
                "longer (or not only) served when it ended: no one model file re-executes it")
    checks = ((Kind.WEIGHTS, "sha256", "model_sha256", "weights"), (Kind.NUMERICS, "numerics_id", "numerics_id",
              "numerics"), (Kind.TOKENIZER, "tokenizer_sha256", "tokenizer_sha256", "tokenizer"))
    for kind, name, host_name, what in checks:
        if model[name] != host[host_name]:
            return (kind, f"model.{name}", f"the {what} differ: the receipt names {_short(model[name])}, this host "
                                           f"has {_short(host[host_name])}")
    template = model["chat_template_sha256"]
    if template is not None and template != host["chat_template_sha256"]:
        return (Kind.TEMPLATE, "model.chat_template_sha256", f"the chat template differs: the receipt names "
                f"{_short(template)}, this host has {_short(host['chat_template_sha256'])}")
    return None


def _sequence(ids: list[int] | tuple[int, ...], end: int | None) -> list[int]:
    return [*ids, end] if end is not None else list(ids)


def _tokens(receipt: dict, outcome: Outcome) -> tuple[int, str, str] | None:
    """The first output position where the re-executed tokens (or the reply's end) differ."""
    claimed = _sequence(receipt["output_token_ids"], receipt["end_token_id"])
    found = _sequence(outcome.token_ids, outcome.end_token_id)
    for position, (mine, theirs) in enumerate(zip(claimed, found)):
        if mine != theirs:
            where = (f"output_token_ids[{position}]" if position < len(receipt["output_token_ids"])
                     else "end_token_id")
            return position, where, f"{where}: the receipt says {mine}, re-executed {theirs}"
    if len(claimed) != len(found):
        more, fewer = ("receipt", "re-execution") if len(claimed) > len(found) else ("re-execution", "receipt")
        return (min(len(claimed), len(found)), "output_token_ids",
                f"the {more} has tokens past the {fewer}'s end ({len(claimed)} against {len(found)})")
    for name, mine, theirs in (("finish_reason", receipt["finish_reason"], outcome.finish_reason),
                               ("num_generated_tokens", receipt["num_generated_tokens"], outcome.num_generated)):
        if mine != theirs:
            return len(claimed), name, f"{name}: the receipt says {mine}, re-executed {theirs}"
    return None


def _reply_ids(receipt: dict, reply: ReplyView | None) -> tuple[int, str, str] | None:
    if reply is None or reply.token_ids is None:
        return None
    claimed = _sequence(receipt["output_token_ids"], receipt["end_token_id"])
    for position, (mine, theirs) in enumerate(zip(claimed, reply.token_ids)):
        if mine != theirs:
            return position, f"reply token_ids[{position}]", f"the reply's token {theirs} is not the receipt's {mine}"
    if len(claimed) != len(reply.token_ids):
        return min(len(claimed), len(reply.token_ids)), "reply token_ids", "the reply has another number of tokens"
    return None


def _logprobs(receipt: dict, outcome: Outcome, reply: ReplyView | None) -> tuple[int | None, str, str] | None:
    position = None
    if reply is not None and reply.entries is not None and outcome.entries is not None:
        computed = wire_entries(outcome.entries)
        if not reply.shows_end:
            computed = computed[:len(outcome.token_ids)]
        position = first_difference(reply.entries, computed)
    if receipt["logprobs_sha256"] != outcome.logprobs_sha256:
        where = "" if position is None else f" (the reply's first differing entry: {position})"
        return position, "logprobs_sha256", f"the logprobs' bits differ from the re-executed ones{where}"
    if position is not None:
        return position, f"reply logprobs[{position}]", (f"the reply's logprob entry {position} is not the "
                                                         "receipt's (re-executed bit for bit)")
    return None


def _prompt_logprobs(receipt: dict, outcome: Outcome, reply: ReplyView | None) -> tuple[int | None, str, str] | None:
    """The scored prompt's bits (positions 1 on) against re-execution: the digest, then each
    number the reply shows of them, named by prompt position and which value it is."""
    found = None
    if reply is not None and reply.prompt is not None and outcome.prompt_entries is not None:
        found = prompt_view.first_difference(reply.prompt, outcome.prompt_entries)
    if receipt["prompt_logprobs_sha256"] != outcome.prompt_logprobs_sha256:
        where = "" if found is None else f" (the reply's first differing one: {found[0].field})"
        return (None if found is None else found[0].position, "prompt_logprobs_sha256",
                "the scored prompt's logprobs' bits differ from the re-executed ones" + where)
    if found is not None:
        shown, expected = found
        token = receipt["prompt_token_ids"][shown.position]
        return shown.position, f"reply {shown.field}", (
            f"prompt position {shown.position} (prompt_token_ids[{shown.position}] = {token}): {shown.what} is "
            f"{shown.value} in the reply, re-executed {expected} (the receipt's digest holds the re-executed bits)")
    return None


def judge(receipt: dict, host: dict, outcome: Outcome | str | None, reply: ReplyView | None = None) -> Verdict:
    """`receipt`: well formed (shape.check_receipt); `host`: the verifying host's model facts
    (model_sha256, numerics_id, tokenizer_sha256, chat_template_sha256); `outcome`: what
    re-executing it gave (a string: why it could not run; None: not run); `reply`: what the reply
    beside it showed, if it came with one."""
    if isinstance(outcome, Outcome) and receipt["finish_reason"] == "abort":  # it ends where it was; its prompt
        # scored only if its prefill completed before the abort
        outcome = outcome.cut(len(receipt["output_token_ids"]), receipt["prompt_logprobs_sha256"] is not None)
    diverged = _tokens(receipt, outcome) if isinstance(outcome, Outcome) else None
    reply_ids = _reply_ids(receipt, reply)
    logprobs = None
    if isinstance(outcome, Outcome) and diverged is None:  # the prompt's positions come before the reply's
        logprobs = _prompt_logprobs(receipt, outcome, reply) or _logprobs(receipt, outcome, reply)
    first = diverged or reply_ids or logprobs
    position = first[0] if first else None
    # Replayed along the receipt's tokens, the token where they part was one these settings could
    # draw there: only the draw chose otherwise, so the seed is what differs.
    by_seed = diverged is not None and outcome.seed_differs
    for found in (_edited(receipt), _facts(receipt, host)):
        if found is not None:
            kind, field, message = found
            if kind is Kind.PARAMS and by_seed:
                field, message = "params.seed", ("the seed is not the one the receipt was made with (its params "
                                                 "checksum fails, and its tokens were drawn with another seed)")
            where = "" if position is None else f"; re-executed, the reply first differs at output position {position}"
            return Verdict(kind, field, position, message + where)
    if isinstance(outcome, str):
        return Verdict(Kind.UNVERIFIABLE, None, None, f"this host could not re-execute it: {outcome}")
    if outcome is None:
        return Verdict(Kind.UNVERIFIABLE, None, None, "not re-executed")
    for kind, found in ((Kind.TOKEN, diverged or reply_ids), (Kind.LOGPROB, logprobs)):
        if found is not None:
            why = (" (a token these settings could draw there, but not the one the receipt's seed draws: the "
                   "tokens were drawn with another seed)") if by_seed else ""
            return Verdict(kind, found[1], position, found[2] + why)
    return Verdict(Kind.MATCH, None, None, "re-executed bit for bit: every token and every logprob")
