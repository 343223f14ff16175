"""A file of receipts as verify-receipt reads it: one receipt, a reply carrying them (a chat or
legacy completion's choices, a Responses `response`), a JSON list of these, or JSONL, one a line.
A bad one is named (where, and which field) and the rest go on."""

import json
from dataclasses import dataclass
from pathlib import Path

from batchproof.notary.receipts.reply_view import ReplyView, chat_view, completions_view, responses_view
from batchproof.notary.receipts.shape import ReceiptError, check_receipt


@dataclass(frozen=True)
class Item:
    where: str  # "line 3, choice 1": where in the file it was
    receipt: dict | None  # well formed; None when it is not (error says why)
    reply: ReplyView | None = None  # what the reply around it showed, when it came in one
    error: ReceiptError | None = None


def _one(receipt: object, where: str, view=None) -> Item:
    """A receipt checked, and (given a function of it) the reply view beside it."""
    if receipt is None:
        return Item(where, None, error=ReceiptError("receipt", "missing: ask for one with `receipt: true`, or serve "
                                                               "with --receipts always"))
    try:
        checked = check_receipt(receipt)
    except ReceiptError as e:
        return Item(where, None, error=e)
    try:
        return Item(where, checked, view(checked) if view is not None else None)
    except (KeyError, TypeError, AttributeError, ValueError) as e:  # a reply's logprobs in no shape we write
        return Item(where, None, error=ReceiptError("reply", f"cannot read the reply's logprobs ({e!r})"))


def items_of(value: object, where: str) -> list[Item]:
    if isinstance(value, list):
        return [item for i, one in enumerate(value) for item in items_of(one, f"{where}[{i}]")]
    if not isinstance(value, dict):
        return [Item(where, None, error=ReceiptError("receipt", "not a JSON object"))]
    if "prompt_token_ids" in value and "version" in value:
        return [_one(value, where)]
    if value.get("object") == "response":
        return [_one(value.get("receipt"), where, lambda _: responses_view(value))]
    if isinstance(value.get("choices"), list):
        legacy = value.get("object") == "text_completion"
        items = []
        for i, choice in enumerate(value["choices"]):
            if not isinstance(choice, dict):
                items.append(Item(f"{where}, choice {i}", None, error=ReceiptError("choices", "not an object")))
                continue

            def view(receipt: dict, choice: dict = choice) -> ReplyView:
                if legacy:
                    return completions_view(choice, len(receipt["output_token_ids"]),
                                            receipt["params"]["top_logprobs"], receipt["prompt_token_ids"],
                                            receipt["params"].get("prompt_logprob_start", 0))
                return chat_view(choice, value, receipt["prompt_token_ids"])

            items.append(_one(choice.get("receipt"), f"{where}, choice {choice.get('index', i)}", view))
        return items
    return [Item(where, None, error=ReceiptError("receipt", "neither a receipt nor a reply carrying receipts"))]


def _refuse(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _loads(text: str) -> object:
    """JSON as the standard reads it: NaN and Infinity, which Python's reader takes, refused."""
    return json.loads(text, parse_constant=_refuse)


def read_items(path: Path) -> list[Item]:
    """Every receipt in the file (one JSON value, or JSONL); blank lines are skipped."""
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        return items_of(_loads(text), path.name)
    except ValueError:  # not one JSON value: JSONL
        pass
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = _loads(line)
        except ValueError as e:
            reason = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
            items.append(Item(f"line {number}", None, error=ReceiptError("line", f"not JSON ({reason})")))
            continue
        items += items_of(value, f"line {number}")
    return items
