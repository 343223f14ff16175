"""notary/receipts/: the digests are the documented bytes, a receipt's shape is checked field by
field (version 1 receipts still read), and the verdict names what differs in the receipt's terms,
first things first: a scored prompt's logprob by its prompt position and which value it is."""

import copy
import hashlib
import json
import math
import struct
from pathlib import Path

import jsonschema
import pytest

from batchproof.common.log_add import log_add
from batchproof.notary import receipts
from batchproof.notary.receipts.format import Outcome, logprobs_sha256, params_checksum, prompt_logprobs_sha256, receipt
from batchproof.notary.receipts.read import items_of, read_items
from batchproof.notary.receipts.reply_view import chat_view
from batchproof.notary.receipts.shape import ReceiptError, check_receipt
from batchproof.notary.receipts.verdict import Kind, judge

HOST = {"model_sha256": "a" * 64, "numerics_id": "n1", "tokenizer_sha256": "b" * 64,
        "chat_template_sha256": "c" * 64, "max_model_len": 64}
MODEL = {"sha256": "a" * 64, "numerics_id": "n1", "tokenizer_sha256": "b" * 64, "chat_template_sha256": "c" * 64}
PARAMS = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0,
          "presence_penalty": 0.0, "frequency_penalty": 0.0, "logit_bias": {}, "seed": 7, "max_tokens": 8,
          "min_tokens": 0, "stop": [], "ignore_eos": False, "top_logprobs": 1, "tail_logprobs": False,
          "logprobs_mode": "raw", "constraint": None, "generator": "splitmix64-v1", "prompt_logprobs": None,
          "prompt_logprob_token_ids": None, "prompt_logprob_start": 0}
ENTRIES = ((5, -0.5, ((5, -0.5),), None), (6, -1.25, ((9, -0.25),), None), (2, -0.125, ((2, -0.125),), None))
OUTCOME = Outcome((5, 6), 2, "stop", 2, ENTRIES)
SPANS = [{"start": 0, "end": 3, "version": "a" * 16}]


def _receipt() -> dict:
    return receipt(MODEL, SPANS, [1, 2, 3], dict(PARAMS), OUTCOME)


def test_the_logprob_digest_is_the_documented_bytes():
    """docs/receipts.md's layout, written out by hand: id int64, logprob float64, count uint32,
    each alternative id and logprob, then 0x00 (no tail) or 0x01 and the tail, big-endian."""
    entries = [(5, -0.5, ((5, -0.5), (7, -1.25)), None), (2, -math.inf, (), 0.0)]
    by_hand = (bytes.fromhex("0000000000000005") + bytes.fromhex("bfe0000000000000") + bytes.fromhex("00000002")
               + bytes.fromhex("0000000000000005") + bytes.fromhex("bfe0000000000000")
               + bytes.fromhex("0000000000000007") + bytes.fromhex("bff4000000000000") + b"\x00"
               + bytes.fromhex("0000000000000002") + bytes.fromhex("fff0000000000000") + bytes.fromhex("00000000")
               + b"\x01" + struct.pack(">d", 0.0))
    assert logprobs_sha256(entries) == hashlib.sha256(by_hand).hexdigest()
    assert logprobs_sha256([(5, -0.5, (), None)]) != logprobs_sha256([(5, math.nextafter(-0.5, 0), (), None)])


def test_float_params_check_however_a_json_library_spells_them():
    assert params_checksum({**PARAMS, "temperature": 1, "logit_bias": {"3": 2}}) == \
        params_checksum({**PARAMS, "temperature": 1.0, "logit_bias": {"3": 2.0}})
    assert params_checksum(PARAMS) != params_checksum({**PARAMS, "seed": 8})


@pytest.mark.parametrize(("edit", "field"), [
    (lambda r: r.pop("params"), "params"),
    (lambda r: r.update(version=3), "version"),
    (lambda r: r.pop("prompt_logprobs_sha256"), "prompt_logprobs_sha256"),
    (lambda r: r["params"].pop("prompt_logprobs"), "params.prompt_logprobs"),
    (lambda r: r["params"].update(prompt_logprob_token_ids=[[1, -2]]), "params.prompt_logprob_token_ids"),
    (lambda r: r.update(version=True), "version"),
    (lambda r: r["params"].update(seed="7"), "params.seed"),
    (lambda r: r["params"].update(top_k=True), "params.top_k"),
    (lambda r: r["model"].pop("numerics_id"), "model.numerics_id"),
    (lambda r: r["model"].update(sha256="xyz"), "model.sha256"),
    (lambda r: r.update(prompt_token_ids=[]), "prompt_token_ids"),
    (lambda r: r.update(output_token_ids=[1, -2]), "output_token_ids"),
    (lambda r: r.update(logprobs_sha256="A" * 64), "logprobs_sha256"),
    (lambda r: r["checksums"].pop("params"), "checksums"),
])
def test_a_malformed_receipt_is_named_by_its_field(edit, field):
    check_receipt(_receipt())
    bad = _receipt()
    edit(bad)
    with pytest.raises(ReceiptError) as caught:
        check_receipt(bad)
    assert caught.value.field == field


def _edited(edit) -> dict:
    r = copy.deepcopy(_receipt())
    edit(r)
    return r


@pytest.mark.parametrize(("name", "edit", "kind", "field"), [
    ("the same", lambda r: None, Kind.MATCH, None),
    ("other weights", lambda r: r["model"].update(sha256="d" * 64), Kind.WEIGHTS, "model.sha256"),
    ("weights swapped out", lambda r: r["model"].update(sha256=None), Kind.WEIGHTS, "weight_versions"),
    ("two versions", lambda r: r["weight_versions"].append({"start": 3, "end": 3, "version": "x"}), Kind.WEIGHTS,
     "weight_versions"),
    ("other numerics", lambda r: r["model"].update(numerics_id="n2"), Kind.NUMERICS, "model.numerics_id"),
    ("another tokenizer", lambda r: r["model"].update(tokenizer_sha256="e" * 64), Kind.TOKENIZER,
     "model.tokenizer_sha256"),
    ("another template", lambda r: r["model"].update(chat_template_sha256="f" * 64), Kind.TEMPLATE,
     "model.chat_template_sha256"),
    ("no template rendered it", lambda r: r["model"].update(chat_template_sha256=None), Kind.MATCH, None),
    ("another seed", lambda r: r["params"].update(seed=8), Kind.PARAMS, "params"),
    ("a changed prompt id", lambda r: r["prompt_token_ids"].__setitem__(1, 9), Kind.PROMPT, "prompt_token_ids"),
    ("seed and weights: the edit first", lambda r: (r["params"].update(seed=8), r["model"].update(sha256="d" * 64)),
     Kind.PARAMS, "params"),
    ("a token", lambda r: r["output_token_ids"].__setitem__(1, 4), Kind.TOKEN, "output_token_ids[1]"),
    ("the end token", lambda r: r.update(end_token_id=0), Kind.TOKEN, "end_token_id"),
    ("a longer reply", lambda r: r["output_token_ids"].append(4), Kind.TOKEN, "output_token_ids[2]"),
    ("another ending", lambda r: r.update(num_generated_tokens=3), Kind.TOKEN, "num_generated_tokens"),
    ("a logprob's bits", lambda r: r.update(logprobs_sha256="0" * 64), Kind.LOGPROB, "logprobs_sha256"),
    ("a prompt logprob's bits", lambda r: r.update(prompt_logprobs_sha256="0" * 64), Kind.LOGPROB,
     "prompt_logprobs_sha256"),
])
def test_the_verdict_names_what_differs(name, edit, kind, field):
    verdict = judge(_edited(edit), HOST, OUTCOME)
    assert (verdict.kind, verdict.field) == (kind, field), verdict.message
    assert verdict.as_json()["exit_code"] == int(kind)


def test_the_first_divergent_position_rides_on_every_kind():
    other_tokens = Outcome((5, 7), 2, "stop", 2, ENTRIES)
    assert judge(_receipt(), HOST, other_tokens).position == 1
    assert judge(_edited(lambda r: r["params"].update(seed=8)), HOST, other_tokens).position == 1
    assert judge(_receipt(), HOST, "the prompt has 3 tokens; the context holds 2").kind == Kind.UNVERIFIABLE


def test_an_aborted_reply_is_held_as_far_as_it_went():
    aborted = receipt(MODEL, SPANS, [1, 2, 3], dict(PARAMS), Outcome((5,), None, "abort", 1, ENTRIES[:1]))
    assert judge(aborted, HOST, OUTCOME).kind == Kind.MATCH
    assert judge(aborted, HOST, Outcome((4, 6), 2, "stop", 2, ENTRIES)).position == 0


def _chat_choice(entries) -> dict:
    def entry(e):
        return {"token": "x", "logprob": e[1], "bytes": [120],
                "top_logprobs": [{"token": "y", "logprob": lp, "bytes": [121]} for _, lp in e[2]]}

    return {"index": 0, "logprobs": {"content": [entry(e) for e in entries[:-1]]},
            "end_token": {"token_id": 2, **entry(entries[-1])}, "token_ids": [5, 6, 2]}


def test_a_logprob_edited_in_the_reply_is_found_at_its_position():
    choice = _chat_choice(ENTRIES)
    assert judge(_receipt(), HOST, OUTCOME, chat_view(choice, {}, [1, 2, 3])).kind == Kind.MATCH
    choice["logprobs"]["content"][1]["top_logprobs"][0]["logprob"] = -0.375
    verdict = judge(_receipt(), HOST, OUTCOME, chat_view(choice, {}, [1, 2, 3]))
    assert (verdict.kind, verdict.field, verdict.position) == (Kind.LOGPROB, "reply logprobs[1]", 1)
    choice = _chat_choice(ENTRIES)
    choice["token_ids"][0] = 4
    assert judge(_receipt(), HOST, OUTCOME, chat_view(choice, {}, [1, 2, 3])).field == "reply token_ids[0]"


def test_a_file_of_receipts_names_each_bad_one(tmp_path):
    good = _receipt()
    reply = {"object": "chat.completion", "choices": [{**_chat_choice(ENTRIES), "receipt": good},
                                                      {"index": 1, "message": {}}]}
    lines = [json.dumps(good), "{not json", json.dumps({**good, "params": {**PARAMS, "temperature": math.nan}}),
             json.dumps(reply), json.dumps({"hello": 1})]
    path = tmp_path / "receipts.jsonl"
    path.write_text("\n".join(lines) + "\n\n")
    items = read_items(path)
    assert [(i.where, i.error.field if i.error else None) for i in items] == [
        ("line 1", None), ("line 2", "line"), ("line 3", "line"), ("line 4, choice 0", None),
        ("line 4, choice 1", "receipt"), ("line 5", "receipt")]
    assert items[3].reply is not None and items[3].reply.token_ids == [5, 6, 2]


# --- a scored prompt (prompt_logprobs, echo, prompt_token_id_logprobs) --------------------------------

# Prompt [1, 2, 3] scored with 2 alternatives, tails, and two ids named for the row scoring position 2.
SCORED = {**PARAMS, "prompt_logprobs": 2, "tail_logprobs": True, "prompt_logprob_token_ids": [[7, -1]],
          "prompt_logprob_start": 1}
PROMPT_ENTRIES = ((2, -1.5, ((4, -0.5), (2, -1.5)), -2.5, None), (3, -2.0, ((3, -2.0), (4, -3.0)), -0.25,
                                                                    (-4.0, -math.inf)))
TAILED = tuple((*e[:3], -3.0) for e in ENTRIES)
SCORED_OUTCOME = Outcome((5, 6), 2, "stop", 2, TAILED, prompt_entries=PROMPT_ENTRIES)


def _scored_receipt() -> dict:
    return check_receipt(receipt(MODEL, SPANS, [1, 2, 3], dict(SCORED), SCORED_OUTCOME))


def test_the_prompt_digest_is_the_documented_bytes():
    """Each position's entry as logprobs_sha256 writes it, then 0x00 (no ids named for its row) or
    0x01, their number as a uint32 and each named logprob as a float64."""
    entry = (2, -1.5, ((4, -0.5),), None)
    by_hand = (struct.pack(">qdI", 2, -1.5, 1) + struct.pack(">qd", 4, -0.5) + b"\x00" + b"\x00"
               + struct.pack(">qdI", 3, -2.0, 0) + b"\x01" + struct.pack(">d", -0.25)
               + b"\x01" + struct.pack(">I", 2) + struct.pack(">dd", -4.0, -math.inf))
    entries = [(*entry, None), (3, -2.0, (), -0.25, (-4.0, -math.inf))]
    assert prompt_logprobs_sha256(entries) == hashlib.sha256(by_hand).hexdigest()
    assert _scored_receipt()["prompt_logprobs_sha256"] == prompt_logprobs_sha256(PROMPT_ENTRIES)
    assert _receipt()["prompt_logprobs_sha256"] is None  # no prompt scored: no digest


def test_a_version_1_receipt_still_reads_and_matches():
    """Written before prompt scoring was in receipts: no prompt_logprobs_sha256, no prompt params,
    its params checksum over the params it has."""
    old = _receipt()
    old["version"] = 1
    del old["prompt_logprobs_sha256"]
    for name in ("prompt_logprobs", "prompt_logprob_token_ids", "prompt_logprob_start"):
        del old["params"][name]
    old["checksums"]["params"] = params_checksum(old["params"])
    assert judge(check_receipt(old), HOST, OUTCOME).kind == Kind.MATCH
    schema = json.loads((Path(receipts.__file__).parent / "receipt.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    validator.validate(old)  # the schema takes both versions, each with its own fields
    validator.validate(_scored_receipt())
    assert not validator.is_valid({**old, "version": 2}) and not validator.is_valid({**_receipt(), "version": 1})
    with pytest.raises(ReceiptError) as caught:
        check_receipt({**old, "version": 2})
    assert caught.value.field == "prompt_logprobs_sha256"


def test_a_prompt_aborted_before_it_was_scored_matches_its_re_execution():
    aborted = receipt(MODEL, SPANS, [1, 2, 3], dict(SCORED), Outcome((), None, "abort", 0, ()))
    assert aborted["prompt_logprobs_sha256"] is None
    assert judge(check_receipt(aborted), HOST, SCORED_OUTCOME).kind == Kind.MATCH


def _chat_reply() -> dict:
    def row(entry):
        token_id, logprob, top = entry[:3]
        ranks = {alt_id: r + 1 for r, (alt_id, _) in enumerate(top)}
        found = {str(token_id): {"logprob": logprob, "rank": ranks.get(token_id), "decoded_token": "t"}}
        for alt_id, alt_logprob in top:
            found.setdefault(str(alt_id), {"logprob": alt_logprob, "rank": ranks[alt_id], "decoded_token": "a"})
        return found

    return {"object": "chat.completion", "prompt_logprobs": [None, *map(row, PROMPT_ENTRIES)]}


def _completion_choice() -> dict:
    """Echo with logprobs 1 (top_logprobs 1): the prompt's entries first, the tail joined with the
    alternative not shown; then the named ids' rows."""
    prompt = [(None, None, None), *((e[1], {f"token_id:{e[2][0][0]}": e[2][0][1]}, e[3]) for e in PROMPT_ENTRIES)]
    # The tails the reply shows join the second alternative: log(exp(tail) + exp(alternative)),
    # by the wire's own log-add.
    prompt[1] = (prompt[1][0], prompt[1][1], log_add(-1.5, -2.5))
    prompt[2] = (prompt[2][0], prompt[2][1], log_add(-0.25, -3.0))
    reply = [(e[1], {f"token_id:{e[2][0][0]}": e[2][0][1]}, -3.0) for e in TAILED[:2]]
    rows = prompt + reply
    end = TAILED[2]
    return {"index": 0, "logprobs": {"tokens": ["x"] * 5, "token_logprobs": [r[0] for r in rows],
                                     "top_logprobs": [r[1] for r in rows], "tail_logprobs": [r[2] for r in rows],
                                     "text_offset": [0] * 5},
            "end_token": {"token_id": 2, "token": "x", "logprob": end[1], "bytes": [],
                          "top_logprobs": [{"token": "y", "logprob": end[2][0][1], "bytes": []}],
                          "tail_logprob": -3.0},
            "prompt_token_id_logprobs": [[-4.0, -9999.0]]}


def _judged(reply: dict, edit=lambda reply: None):
    """The verdict on the one receipt the reply carries, re-executed as SCORED_OUTCOME, after `edit`."""
    reply = copy.deepcopy(reply)
    edit(reply)
    [item] = items_of(reply, "reply")
    verdict = judge(item.receipt, HOST, SCORED_OUTCOME, item.reply)
    return verdict.kind, verdict.field, verdict.position


def test_a_prompt_logprob_edited_in_a_chat_reply_is_named_by_position_and_value():
    reply = {**_chat_reply(), "choices": [{"index": 0, "message": {}, "logprobs": None,
                                           "receipt": _scored_receipt()}]}
    assert _judged(reply) == (Kind.MATCH, None, None)
    rows = "prompt_logprobs"
    assert _judged(reply, lambda r: r[rows][2]["4"].update(logprob=-3.125)) == (
        Kind.LOGPROB, "reply prompt_logprobs[2]['4'].logprob", 2)
    assert _judged(reply, lambda r: r[rows][1]["2"].update(logprob=-1.25)) == (
        Kind.LOGPROB, "reply prompt_logprobs[1]['2'].logprob", 1)
    assert _judged(reply, lambda r: r[rows][1]["2"].update(rank=1)) == (
        Kind.LOGPROB, "reply prompt_logprobs[1]['2'].rank", 1)
    # The receipt's digest edited too (a forger's new sha256): the digest is named, at the reply's position.
    assert _judged(reply, lambda r: (r[rows][2]["3"].update(logprob=-1.0),
                                     r["choices"][0]["receipt"].update(prompt_logprobs_sha256="1" * 64))) == (
        Kind.LOGPROB, "prompt_logprobs_sha256", 2)
    edited = copy.deepcopy(reply)
    edited[rows][2]["4"]["logprob"] = -3.125
    [one] = items_of(edited, "reply")
    message = judge(one.receipt, HOST, SCORED_OUTCOME, one.reply).message
    assert "prompt position 2 (prompt_token_ids[2] = 3): the logprob of alternative 4 is -3.125" in message


def test_a_prompt_logprob_edited_in_an_echoed_completion_is_named_by_position_and_value():
    reply = {"object": "text_completion", "choices": [{**_completion_choice(), "receipt": _scored_receipt()}]}
    assert _judged(reply) == (Kind.MATCH, None, None)
    logprobs = lambda r: r["choices"][0]["logprobs"]  # noqa: E731
    assert _judged(reply, lambda r: logprobs(r)["token_logprobs"].__setitem__(1, -1.4375)) == (
        Kind.LOGPROB, "reply logprobs.token_logprobs[1]", 1)
    assert _judged(reply, lambda r: logprobs(r)["tail_logprobs"].__setitem__(2, -0.5)) == (
        Kind.LOGPROB, "reply logprobs.tail_logprobs[2]", 2)
    assert _judged(reply, lambda r: logprobs(r)["top_logprobs"].__setitem__(2, {"token_id:4": -2.0})) == (
        Kind.LOGPROB, "reply logprobs.top_logprobs[2]['token_id:4']", 2)
    assert _judged(reply, lambda r: r["choices"][0]["prompt_token_id_logprobs"][0].__setitem__(1, -9.0)) == (
        Kind.LOGPROB, "reply prompt_token_id_logprobs[0][1]", 2)
    # The reply's own tokens come after its prompt's: an edit there is still found at its output position.
    assert _judged(reply, lambda r: logprobs(r)["token_logprobs"].__setitem__(4, -1.0)) == (
        Kind.LOGPROB, "reply logprobs[1]", 1)
