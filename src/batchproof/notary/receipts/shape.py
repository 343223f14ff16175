"""A receipt read from a file, checked before anything re-executes it: every field present, of
its type, a bad one named in the receipt's own terms (`params.seed`, `model.sha256`). The fields
and types of receipt.schema.json, in plain Python (the verifier needs no schema library); a
setting's range is the engine's to check, when it runs one."""

import re
from collections.abc import Callable

from batchproof.notary.receipts.format import VERSIONS

HEX64 = re.compile(r"[0-9a-f]{64}")
TOKEN_ID_KEY = re.compile(r"[0-9]{1,18}")  # ASCII digits only: str.isdigit() also takes "²"
FINISH_REASONS = ("stop", "length", "abort")


class ReceiptError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"'{field}': {message}")
        self.field = field


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _token_ids(value: object) -> bool:
    return isinstance(value, list) and all(_int(t) and t >= 0 for t in value)


def _optional(test: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: value is None or test(value)


def _hex(value: object) -> bool:
    return isinstance(value, str) and HEX64.fullmatch(value) is not None


MODEL = {"sha256": (_optional(_hex), "a sha256 (64 hex digits) or null"),
         "numerics_id": (lambda v: isinstance(v, str), "a string"),
         "tokenizer_sha256": (_hex, "a sha256"),
         "chat_template_sha256": (_optional(_hex), "a sha256 or null")}
PARAMS = {
    **{name: (_number, "a number") for name in ("temperature", "top_p", "min_p", "repetition_penalty",
                                                  "presence_penalty", "frequency_penalty")},
    "top_k": (_int, "an integer"), "max_tokens": (_int, "an integer"), "min_tokens": (_int, "an integer"),
    "seed": (_optional(_int), "an integer or null"),
    "logit_bias": (lambda v: isinstance(v, dict) and all(TOKEN_ID_KEY.fullmatch(k) and _number(b)
                                                         for k, b in v.items()), "an object of token id -> bias"),
    "stop": (lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v), "a list of strings"),
    "ignore_eos": (lambda v: isinstance(v, bool), "true or false"),
    "top_logprobs": (_optional(lambda v: _int(v) and v >= 0), "an integer >= 0 or null"),
    "tail_logprobs": (lambda v: isinstance(v, bool), "true or false"),
    "logprobs_mode": (lambda v: v in ("raw", "processed"), "raw or processed"),
    "constraint": (_optional(lambda v: isinstance(v, dict) and isinstance(v.get("kind"), str)
                             and isinstance(v.get("grammar"), str)), "null or {kind, grammar}"),
    "generator": (_optional(lambda v: isinstance(v, str)), "a string or null"),
}
# Version 2's prompt scoring (absent from version 1 receipts, which scored no prompt).
PROMPT_PARAMS = {
    "prompt_logprobs": (_optional(lambda v: _int(v) and v >= 0), "an integer >= 0 or null"),
    "prompt_logprob_token_ids": (_optional(lambda v: isinstance(v, list) and all(
        isinstance(row, list) and all(_int(t) and t >= -1 for t in row) for row in v)),
        "null or a list of rows of token ids (-1 pads a row)"),
    "prompt_logprob_start": (lambda v: _int(v) and v >= 0, "an integer >= 0"),
}
PROMPT_TOP = {"prompt_logprobs_sha256": (_optional(_hex), "a sha256 or null")}
TOP = {
    "version": (lambda v: _int(v) and v in VERSIONS, f"one of {', '.join(map(str, VERSIONS))} (the versions "
                                                      "this verifier reads)"),
    "prompt_token_ids": (lambda v: _token_ids(v) and len(v) > 0, "a non-empty list of token ids"),
    "output_token_ids": (_token_ids, "a list of token ids"),
    "end_token_id": (_optional(lambda v: _int(v) and v >= 0), "a token id or null"),
    "finish_reason": (_optional(lambda v: v in FINISH_REASONS), f"one of {', '.join(FINISH_REASONS)} or null"),
    "num_generated_tokens": (lambda v: _int(v) and v >= 0, "an integer >= 0"),
    "logprobs_sha256": (_optional(_hex), "a sha256 or null"),
    "weight_versions": (lambda v: isinstance(v, list) and all(
        isinstance(s, dict) and _int(s.get("start")) and _int(s.get("end")) and isinstance(s.get("version"), str)
        for s in v), "a list of {start, end, version}"),
    "checksums": (lambda v: isinstance(v, dict) and _hex(v.get("prompt_token_ids")) and _hex(v.get("params")),
                  "{prompt_token_ids, params}, each a sha256"),
}


def _check(obj: dict, rules: dict, where: str) -> None:
    for name, (test, what) in rules.items():
        field = f"{where}{name}"
        if name not in obj:
            raise ReceiptError(field, "missing")
        if not test(obj[name]):
            raise ReceiptError(field, f"must be {what}, got {str(obj[name])[:80]}")


def check_receipt(receipt: object) -> dict:
    """The receipt, if well formed; else a ReceiptError naming the first bad field."""
    if not isinstance(receipt, dict):
        raise ReceiptError("receipt", "must be a JSON object")
    _check(receipt, TOP, "")
    is_v1 = receipt["version"] == 1
    if not is_v1:
        _check(receipt, PROMPT_TOP, "")
    for name, rules in (("model", MODEL), ("params", PARAMS if is_v1 else {**PARAMS, **PROMPT_PARAMS})):
        if not isinstance(receipt.get(name), dict):
            raise ReceiptError(name, "must be an object")
        _check(receipt[name], rules, f"{name}.")
    # Version 1 read as version 2 without prompt scoring; its params stay as written (their checksum).
    return {**receipt, "prompt_logprobs_sha256": None} if is_v1 else receipt
