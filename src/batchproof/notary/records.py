"""One rollout a record (a JSONL line, or an item of the HTTP request's list): the prompt and
completion token ids, the engine's claimed logprob of each completion token, and optionally its
top alternatives. Checked whole before anything is scored, so a bad record is named with the
field and value that make it so, and the rest go on."""

import json
import math
import re
from dataclasses import dataclass

from batchproof.notary.routes import Routes, RoutesError, parse_routes

FIELDS = ("prompt_token_ids", "completion_token_ids", "logprobs", "top_logprobs", "id", "routed_experts")
TOKEN_KEY = re.compile(r"[0-9]{1,12}")  # a top_logprobs key: a token id in decimal


@dataclass(frozen=True)
class Rollout:
    where: str  # "line 7" (a file) or "rollouts[6]" (a request): how reports and errors name it
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]  # the claimed logprob of each completion token
    # Per completion token, the claimant's alternatives {id: logprob} (None where it gave none).
    top_logprobs: list[dict[int, float] | None] | None = None
    rollout_id: str | None = None
    # The MoE routing the claimant's engine chose (notary/routes.py), one row per fed position.
    routed_experts: Routes | None = None


class RecordError(ValueError):
    """A record that cannot be scored; `field` names the part at fault, as the API spells it."""

    def __init__(self, where: str, field: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.field = field


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_line(text: str, where: str, vocab_size: int) -> Rollout:
    """A JSONL line -> its Rollout; RecordError (naming the line) when it is not one."""
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except ValueError as e:
        raise RecordError(where, "line", f"not JSON ({e})") from None
    return parse_record(obj, where, vocab_size)


def _ids(obj: dict, field: str, where: str, vocab_size: int) -> list[int]:
    value = obj.get(field)
    if not isinstance(value, list):
        raise RecordError(where, field, f"'{field}' must be a list of token ids, got {_shown(value)}")
    for i, token_id in enumerate(value):
        if not isinstance(token_id, int) or isinstance(token_id, bool) or not 0 <= token_id < vocab_size:
            raise RecordError(where, field, f"'{field}[{i}]' is {_shown(token_id)}: not a token id in "
                                            f"0..{vocab_size - 1}")
    return value


def _logprob(value: object, name: str, where: str, field: str) -> float:
    number = as_float(value)
    if number is None or number > 0:
        raise RecordError(where, field, f"'{name}' is {_shown(value)}: a logprob is a finite number <= 0 that a "
                                        "float holds")
    return number


def as_float(value: object) -> float | None:
    """A JSON number as the float it names; None when it names none: not a number, or past the
    float range (JSON's 1e400 decodes as infinity, 10**400 as an int no float holds)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def parse_record(obj: object, where: str, vocab_size: int) -> Rollout:
    """A decoded record -> its Rollout, every id inside the vocabulary and every length matching."""
    if not isinstance(obj, dict):
        raise RecordError(where, "record", f"a rollout is a JSON object, got {_shown(obj)}")
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise RecordError(where, unknown[0], f"'{unknown[0]}' is not a rollout field (fields: {', '.join(FIELDS)})")
    prompt = _ids(obj, "prompt_token_ids", where, vocab_size)
    if not prompt:
        raise RecordError(where, "prompt_token_ids", "'prompt_token_ids' is empty: the first completion token "
                                                     "needs a prompt to be predicted from")
    completion = _ids(obj, "completion_token_ids", where, vocab_size)
    claimed = obj.get("logprobs")
    if not isinstance(claimed, list):
        raise RecordError(where, "logprobs", f"'logprobs' must be a list of numbers, got {_shown(claimed)}")
    if len(claimed) != len(completion):
        raise RecordError(where, "logprobs", f"'logprobs' has {len(claimed)} values for {len(completion)} "
                                             "completion tokens (one each)")
    logprobs = [_logprob(v, f"logprobs[{i}]", where, "logprobs") for i, v in enumerate(claimed)]
    rollout_id = obj.get("id")
    if rollout_id is not None and not isinstance(rollout_id, str):
        raise RecordError(where, "id", f"'id' must be a string, got {_shown(rollout_id)}")
    routes = None
    if obj.get("routed_experts") is not None:
        try:
            routes = parse_routes(obj["routed_experts"], len(prompt) + len(completion) - 1)
        except RoutesError as e:
            raise RecordError(where, "routed_experts", f"'routed_experts': {e}") from None
    return Rollout(where, prompt, completion, logprobs, _top(obj.get("top_logprobs"), len(completion), where,
                                                             vocab_size), rollout_id, routes)


def _top(value: object, num_tokens: int, where: str, vocab_size: int) -> list[dict[int, float] | None] | None:
    """vLLM's shape for alternatives: per token, {"<id>": logprob} (or null)."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != num_tokens:
        count = len(value) if isinstance(value, list) else _shown(value)
        raise RecordError(where, "top_logprobs", f"'top_logprobs' must be a list of {num_tokens} objects "
                                                 f"(one per completion token), got {count}")
    result: list[dict[int, float] | None] = []
    for i, entry in enumerate(value):
        if entry is None:
            result.append(None)
            continue
        if not isinstance(entry, dict):
            raise RecordError(where, "top_logprobs", f"'top_logprobs[{i}]' must be an object {{token id: logprob}}, "
                                                     f"got {_shown(entry)}")
        row = {}
        for key, logprob in entry.items():
            # ASCII digits only: "²" passes str.isdigit() and int() refuses it; "١" int() reads as 1.
            if not isinstance(key, str) or not TOKEN_KEY.fullmatch(key) or not int(key) < vocab_size:
                raise RecordError(where, "top_logprobs", f"'top_logprobs[{i}]' key {_shown(key)} is not a token id "
                                                         f"in 0..{vocab_size - 1}")
            row[int(key)] = _logprob(logprob, f"top_logprobs[{i}][{key}]", where, "top_logprobs")
        result.append(row)
    return result


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
