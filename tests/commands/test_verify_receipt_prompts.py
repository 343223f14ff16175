"""`batchproof verify-receipt` on replies that scored their prompt (vLLM's prompt_logprobs on chat
and completions, echo with logprobs, prompt_token_id_logprobs): every one MATCHes re-executed in
this process (replayed in one prefill, or generated and scored again) and on another server
started fresh; an edited prompt logprob is named by its prompt position and which value it is."""

import copy

import pytest

from batchproof import cli
from batchproof.commands.receipts.local import LocalHost
from batchproof.commands.receipts.reexecute import reexecute, verify
from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.notary.receipts.format import params_checksum
from batchproof.notary.receipts.read import read_items
from tests.commands.test_verify_receipt import _receipts, _sent_at_once, _write
from tests.helpers.http import chat_body
from tests.helpers.live_server import live_server

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
PROMPT = [1, 504, 3458, 282, 4649, 314, 7042, 30]  # token ids: echo's entries line up with them
SCORED = [
    (CHAT, chat_body("Name three colors.", max_tokens=6, temperature=0, logprobs=True, top_logprobs=2,
                     prompt_logprobs=3)),
    (CHAT, chat_body("Say hello.", max_tokens=6, temperature=0.8, seed=7, logprobs=True, top_logprobs=1,
                     return_tail_logprobs=True, prompt_logprobs=2)),
    (CHAT, chat_body("Count to five.", max_tokens=8, temperature=0, stop=[","], prompt_logprobs=1)),  # generated
    (COMPLETIONS, {"prompt": PROMPT, "max_tokens": 4, "n": 2, "seed": 3, "temperature": 1.0, "echo": True,
                   "logprobs": 2, "prompt_logprobs": 1, "return_tail_logprobs": True,
                   "return_tokens_as_token_ids": True}),
    (COMPLETIONS, {"prompt": "The capital of France is", "max_tokens": 0, "echo": True, "logprobs": 3}),
    (COMPLETIONS, {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "logprobs": 1,
                   "prompt_logprob_token_ids": [[30, 282, -1], [7042], [1, 2], [3458, 314], [504], [282, 30]],
                   "prompt_logprob_start": 1}),
]
NUM_RECEIPTS = 7


@pytest.fixture(scope="module")
def scored(engine) -> list:
    with live_server(engine) as live:
        return _sent_at_once(live.url, SCORED)


def _verdicts(engine, tmp_path, values: list, replays: bool = True) -> list[dict]:
    """verify-receipt's verdicts in this process; `replays` False: the other routes (generated or
    scored again, each prompt then scored on its own)."""
    return [v.as_json() for v in verify(read_items(_write(tmp_path, values)), LocalHost(engine, replays))]


def test_every_scored_prompt_is_named_and_digested(scored):
    receipts = _receipts(scored)
    assert len(receipts) == NUM_RECEIPTS
    assert all(r["version"] == 2 and r["prompt_logprobs_sha256"] is not None for r in receipts)
    assert [r["params"]["prompt_logprobs"] for r in receipts] == [3, 2, 1, 2, 2, 3, 0]
    assert receipts[-1]["params"]["prompt_logprob_start"] == 1  # the named rows' receipt


def test_they_match_in_process_on_every_route(engine, scored, tmp_path):
    replayed = _verdicts(engine, tmp_path, scored)
    assert [v["verdict"] for v in replayed] == ["MATCH"] * NUM_RECEIPTS, replayed
    generated = _verdicts(engine, tmp_path, scored, replays=False)
    assert [v["verdict"] for v in generated] == ["MATCH"] * NUM_RECEIPTS, generated


def test_the_prompt_replayed_is_bitwise_the_one_scored_again(engine, scored):
    """One prefill of prompt + reply scores the prompt too; scored on its own or while generating
    again, its entries are the same floats."""
    receipts = _receipts(scored)
    assert LocalHost(engine).replays  # our kernels: the prefill route is taken
    facts = LocalHost(engine).facts()
    replayed = reexecute(receipts, LocalHost(engine), facts)
    again = reexecute(receipts, LocalHost(engine, replays=False), facts)
    assert [o.prompt_entries for o in replayed] == [o.prompt_entries for o in again]
    assert [o.prompt_logprobs_sha256 for o in replayed] == [r["prompt_logprobs_sha256"] for r in receipts]


def test_they_match_on_another_server_started_fresh(scored, tmp_path, capsys):
    fresh = Engine(EngineConfig(device="cpu"))
    with live_server(fresh) as live:
        code = cli.main(["verify-receipt", str(_write(tmp_path, scored)), "--url", live.url])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert printed.count(": MATCH") == NUM_RECEIPTS


# --- an edited prompt logprob: named by prompt position and which value --------------------------------


def _one(engine, tmp_path, value, edit, choice: int = 0) -> dict:
    """The verdict on choice `choice` of the reply, edited."""
    value = copy.deepcopy(value)
    edit(value)
    return _verdicts(engine, tmp_path, [value])[choice]


def test_an_edited_prompt_logprob_in_a_chat_reply_is_named(engine, scored, tmp_path):
    chat = scored[0]
    position = 4
    token = str(chat["choices"][0]["receipt"]["prompt_token_ids"][position])
    verdict = _one(engine, tmp_path, chat, lambda r: r["prompt_logprobs"][position][token].update(
        logprob=r["prompt_logprobs"][position][token]["logprob"] - 2**-20))
    assert (verdict["verdict"], verdict["exit_code"], verdict["position"]) == ("LOGPROB", 10, position)
    assert verdict["field"] == f"reply prompt_logprobs[{position}]['{token}'].logprob"
    assert f"prompt_token_ids[{position}] = {token}): the logprob of prompt token {token}" in verdict["message"]


def test_an_edited_echoed_or_named_prompt_logprob_is_named(engine, scored, tmp_path):
    echo, named = scored[3], scored[5]

    def tail(reply):
        reply["choices"][1]["logprobs"]["tail_logprobs"][2] += 2**-20  # choice 1 shows the prompt choice 0 scored

    verdict = _one(engine, tmp_path, echo, tail, choice=1)
    assert (verdict["verdict"], verdict["field"], verdict["position"]) == (
        "LOGPROB", "reply logprobs.tail_logprobs[2]", 2)

    def row(reply):
        reply["choices"][0]["prompt_token_id_logprobs"][2][1] -= 2**-20  # row 2 scores position 1 + 2 + 1

    verdict = _one(engine, tmp_path, named, row)
    assert (verdict["verdict"], verdict["field"], verdict["position"]) == (
        "LOGPROB", "reply prompt_token_id_logprobs[2][1]", 4)


def test_an_edited_prompt_digest_or_setting_is_named(engine, scored, tmp_path):
    receipt = lambda r: r["choices"][0]["receipt"]  # noqa: E731
    verdict = _one(engine, tmp_path, scored[1], lambda r: receipt(r).update(prompt_logprobs_sha256="0" * 64))
    assert (verdict["verdict"], verdict["field"]) == ("LOGPROB", "prompt_logprobs_sha256")
    verdict = _one(engine, tmp_path, scored[1], lambda r: receipt(r)["params"].update(prompt_logprobs=5))
    assert (verdict["verdict"], verdict["field"]) == ("PARAMS", "params")

    def forged(reply):  # another number of alternatives, its checksum made to fit: the digest no longer does
        receipt(reply)["params"]["prompt_logprobs"] = 5
        receipt(reply)["checksums"]["params"] = params_checksum(receipt(reply)["params"])

    verdict = _one(engine, tmp_path, scored[1], forged)
    assert (verdict["verdict"], verdict["field"]) == ("LOGPROB", "prompt_logprobs_sha256")


def test_a_version_1_receipt_still_verifies(engine, scored, tmp_path):
    """A receipt written before prompt scoring was covered: no prompt fields, checksums over the rest."""
    old = copy.deepcopy(_receipts(scored)[2])
    old["version"] = 1
    del old["prompt_logprobs_sha256"]
    for name in ("prompt_logprobs", "prompt_logprob_token_ids", "prompt_logprob_start"):
        del old["params"][name]
    old["checksums"]["params"] = params_checksum(old["params"])
    [verdict] = _verdicts(engine, tmp_path, [old])
    assert verdict["verdict"] == "MATCH", verdict
