"""`batchproof verify-receipt`: receipts from a mixed batch (greedy and seeded, with logprobs,
alternatives and tails, chat, completions and Responses, streamed or not) all MATCH re-executed
in this process and on another server started fresh; each tampered input is named for what it
is, in the receipt's terms, with the exit code scripts read."""

import argparse
import concurrent.futures
import copy
import json

import numpy as np
import pytest

from batchproof import cli
from batchproof.commands import verify_receipt
from batchproof.commands.receipts.local import LocalHost
from batchproof.commands.receipts.reexecute import verify
from batchproof.commands.receipts.replay import is_replayable
from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.notary.receipts.format import params_checksum
from batchproof.notary.receipts.read import read_items
from batchproof.notary.receipts.verdict import Kind
from tests.helpers.http import chat_body, chunks, messages, post, stream
from tests.helpers.live_server import live_server
from tests.helpers.tiny_gguf import TinySpec, write_tiny_gguf

CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"
PROMPTS = ["Name three colors of the rainbow.", "What is 2 + 2?", "Write a haiku about rain.", "Say hello.",
           "List two fruits.", "Why is the sky blue?", "Count to five.", "Name a planet."]
SAMPLED = {"temperature": 0.8, "top_p": 0.9, "seed": 7}

# Sixteen requests sent at once (the engine's batch), each kind of reply a receipt covers.
MIXED = [
    *[(CHAT, chat_body(p, max_tokens=8, logprobs=True, top_logprobs=2, return_token_ids=True)) for p in PROMPTS[:3]],
    (CHAT, chat_body(PROMPTS[3], max_tokens=8, logprobs=True, top_logprobs=3, return_tail_logprobs=True)),
    (CHAT, chat_body(PROMPTS[4], max_tokens=8, **SAMPLED, logprobs=True, top_logprobs=3, return_tail_logprobs=True)),
    (CHAT, chat_body(PROMPTS[5], max_tokens=8, temperature=1.0, top_k=20, min_p=0.05, logprobs=True)),  # no seed
    (CHAT, chat_body(PROMPTS[6], max_tokens=8, **SAMPLED, logprobs=True, top_logprobs=2, logprobs_mode="processed")),
    (CHAT, chat_body(PROMPTS[7], max_tokens=8, stop=[","], logprobs=True, top_logprobs=1)),
    (CHAT, chat_body(PROMPTS[0], max_tokens=8, repetition_penalty=1.3, logit_bias={"30": 2.5}, logprobs=True)),
    (CHAT, chat_body(PROMPTS[1], max_tokens=8, min_tokens=4, ignore_eos=True, presence_penalty=0.5)),
    (COMPLETIONS, {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "logprobs": 0,
                   "return_tail_logprobs": True}),
    (COMPLETIONS, {"prompt": ["Once upon a time", "In 1969,"], "max_tokens": 8, "n": 2, "seed": 3,
                   "temperature": 1.0, "logprobs": 2, "frequency_penalty": 0.4}),
    (COMPLETIONS, {"prompt": [1, 9690, 198, 2683], "max_tokens": 6, "temperature": 0}),  # no logprobs
    (RESPONSES, {"input": PROMPTS[2], "max_output_tokens": 8, "temperature": 0, "top_logprobs": 2,
                 "include": ["message.output_text.logprobs"]}),
    (RESPONSES, {"input": PROMPTS[3], "max_output_tokens": 8, **SAMPLED}),
    (CHAT, chat_body(PROMPTS[4], max_tokens=8, **SAMPLED, logprobs=True, stream=True)),
]


def _send(url: str, path: str, body: dict) -> dict | list:
    """A reply with receipts (a stream: the receipts its last chunks carried, bare)."""
    body = {**body, "receipt": True}
    if body.get("stream"):
        _, _, events = stream(url, path, body)
        return [c["receipt"] for chunk in chunks(events) for c in chunk["choices"] if "receipt" in c]
    response = post(url, path, body)
    assert response.status_code == 200, response.text
    return response.json()


def _sent_at_once(url: str, requests: list[tuple[str, dict]]) -> list:
    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(lambda r: _send(url, *r), requests))


@pytest.fixture(scope="module")
def mixed(engine) -> list:
    with live_server(engine) as live:
        return _sent_at_once(live.url, MIXED)


def _write(tmp_path, values: list, name: str = "receipts.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(v) + "\n" for v in values))
    return path


def _verify(engine, path, out=None, **flags) -> int:
    args = argparse.Namespace(file=path, url=None, api_key=None, out=out, json=False, model_path=None)
    return verify_receipt.run(args, engine=engine)


def _receipts(values: list) -> list[dict]:
    found = []
    for value in values:
        if isinstance(value, list):
            found += value
        elif "choices" in value:
            found += [c["receipt"] for c in value["choices"]]
        else:
            found.append(value["receipt"])
    return found


def test_a_mixed_batch_matches_in_process(engine, mixed, tmp_path, capsys):
    receipts = _receipts(mixed)
    assert len(receipts) == 19
    # Replayed, greedy and sampled alike; only a reply a stop string cut (its cut tokens are in no
    # receipt) is generated again.
    replayed = [is_replayable(r) for r in receipts]
    assert replayed == [r["num_generated_tokens"] == len(r["output_token_ids"]) for r in receipts]
    assert sum(replayed) >= 18 and any(r["params"]["seed"] is not None for r, ok in zip(receipts, replayed) if ok)
    assert _verify(engine, _write(tmp_path, mixed), out=tmp_path / "out") == 0
    printed = capsys.readouterr().out
    assert printed.count(": MATCH") == 19 and "19 receipts: 19 MATCH" in printed
    report = json.loads((tmp_path / "out" / "verdicts.json").read_text())
    assert report["summary"] == {"num_receipts": 19, "num_match": 19, "verdicts": {"MATCH": 19}, "exit_code": 0}
    page = (tmp_path / "out" / "report.html").read_text()
    assert "All 19 receipts re-executed bit for bit" in page and "<script" not in page


def test_a_mixed_batch_matches_on_another_server_started_fresh(mixed, tmp_path, capsys):
    fresh = Engine(EngineConfig(device="cpu"))
    with live_server(fresh) as live:
        code = cli.main(["verify-receipt", str(_write(tmp_path, mixed)), "--url", live.url])
    assert code == 0, capsys.readouterr().out
    assert capsys.readouterr().out.count(": MATCH") == 19


def test_a_reply_beside_15_others_matches_and_is_the_one_made_alone(engine, mixed, tmp_path):
    with live_server(engine) as live:
        alone = _send(live.url, *MIXED[4])  # seeded, with alternatives and tails
    assert mixed[4]["choices"][0]["receipt"] == alone["choices"][0]["receipt"]
    assert _verify(engine, _write(tmp_path, [mixed[4]])) == Kind.MATCH


# --- tampering: each named for what it is -------------------------------------------------------------


@pytest.fixture
def verdict_of(engine, tmp_path, capsys):
    def run(value, edit=lambda v: None, host=None) -> dict:
        value = copy.deepcopy(value)
        edit(value)
        args = argparse.Namespace(file=_write(tmp_path, [value]), url=None, api_key=None, out=None, json=True,
                                  model_path=None)
        code = verify_receipt.run(args, engine=host or engine)
        verdict = json.loads(capsys.readouterr().out.splitlines()[-1])
        assert verdict["exit_code"] == code
        return verdict

    return run


def _greedy(mixed) -> dict:
    return mixed[0]  # chat, greedy, logprobs with 2 alternatives, token ids


def _seeded(mixed) -> dict:
    return mixed[4]  # chat, seed 7, top_p, logprobs with 3 alternatives and tails


def test_the_untouched_replies_match(mixed, verdict_of):
    assert verdict_of(_greedy(mixed))["verdict"] == "MATCH"
    assert verdict_of(_seeded(mixed))["verdict"] == "MATCH"


def test_another_seed_is_named_as_the_seed(mixed, verdict_of):
    verdict = verdict_of(_seeded(mixed), lambda r: r["choices"][0]["receipt"]["params"].update(seed=8))
    assert (verdict["verdict"], verdict["exit_code"], verdict["field"]) == ("PARAMS", 7, "params.seed")
    assert verdict["position"] is not None  # re-executed with seed 8, the reply goes another way


def test_a_seed_forged_with_its_checksum_is_named_as_the_seed(mixed, verdict_of):
    def forge(reply):
        receipt = reply["choices"][0]["receipt"]
        receipt["params"]["seed"] = 8
        receipt["checksums"]["params"] = params_checksum(receipt["params"])

    verdict = verdict_of(_seeded(mixed), forge)
    assert (verdict["verdict"], verdict["exit_code"]) == ("TOKEN", 9)
    assert verdict["field"] == f"output_token_ids[{verdict['position']}]" and "another seed" in verdict["message"]


def test_every_receipt_replayed_is_bitwise_the_one_generated_again(engine, mixed):
    """The prefill route (one prefill of prompt + reply, each position's choice checked) against
    the decode route (generated again with the same seed), receipt by receipt."""
    receipts = [r for r in _receipts(mixed) if is_replayable(r)]
    replayed = LocalHost(engine).replay(receipts)
    generated = LocalHost(engine, replays=False).generate([(r["prompt_token_ids"], r["params"]) for r in receipts])
    assert replayed == generated  # every token, ending and logprob entry, float for float
    assert [o.logprobs_sha256 for o in replayed] == [r["logprobs_sha256"] for r in receipts]


def _tampered(mixed) -> list[dict]:
    """Every receipt of the batch, and each once more with one edit, the edits taken in turn (so
    each kind of edit meets several kinds of receipt): its seed, a token, its digest, a prompt
    id, its end."""
    receipts = _receipts(mixed)
    edits = [lambda r: r["params"].update(seed=(r["params"]["seed"] or 0) + 1),
             lambda r: r["output_token_ids"].__setitem__(-1, r["output_token_ids"][-1] + 1),
             lambda r: r.update(logprobs_sha256="0" * 64),
             lambda r: r["prompt_token_ids"].__setitem__(2, r["prompt_token_ids"][2] + 1),
             lambda r: r.update(finish_reason="abort" if r["finish_reason"] != "abort" else "length")]
    tampered = []
    for i, receipt in enumerate(receipts):
        usable = edits if receipt["output_token_ids"] else edits[2:]
        tampered.append(copy.deepcopy(receipt))
        usable[i % len(usable)](tampered[-1])
        tampered[-1]["checksums"]["params"] = params_checksum(tampered[-1]["params"])  # a forger's care
    return receipts + tampered


def test_both_routes_give_every_receipt_the_same_verdict(engine, mixed, tmp_path):
    items = read_items(_write(tmp_path, _tampered(mixed)))
    replayed, generated = verify(items, LocalHost(engine)), verify(items, LocalHost(engine, replays=False))
    assert [(v.kind, v.position) for v in replayed] == [(v.kind, v.position) for v in generated]
    kinds = {v.kind for v in replayed}
    assert {Kind.MATCH, Kind.TOKEN, Kind.LOGPROB, Kind.PROMPT} <= kinds


def test_a_changed_prompt_id_is_named_prompt(mixed, verdict_of):
    def edit(reply):
        reply["choices"][0]["receipt"]["prompt_token_ids"][5] += 1

    verdict = verdict_of(_greedy(mixed), edit)
    assert (verdict["verdict"], verdict["exit_code"], verdict["field"]) == ("PROMPT", 8, "prompt_token_ids")


def test_an_edited_logprob_is_named_logprob_at_its_position(mixed, verdict_of):
    def in_the_reply(reply):
        reply["choices"][0]["logprobs"]["content"][3]["logprob"] -= 2**-20

    verdict = verdict_of(_greedy(mixed), in_the_reply)
    assert (verdict["verdict"], verdict["exit_code"], verdict["position"]) == ("LOGPROB", 10, 3)
    assert verdict["field"] == "reply logprobs[3]"
    verdict = verdict_of(_seeded(mixed), lambda r: r["choices"][0]["receipt"].update(logprobs_sha256="0" * 64))
    assert (verdict["verdict"], verdict["field"]) == ("LOGPROB", "logprobs_sha256")


def test_an_edited_token_is_named_token_at_its_position(mixed, verdict_of):
    def edit(reply):
        reply["choices"][0]["receipt"]["output_token_ids"][2] += 1

    for value in (_greedy(mixed), _seeded(mixed)):  # the prefill route and the generating one
        verdict = verdict_of(value, edit)
        assert (verdict["verdict"], verdict["exit_code"], verdict["position"]) == ("TOKEN", 9, 2)
        assert verdict["field"] == "output_token_ids[2]"


def test_a_malformed_receipt_is_named_by_its_field(mixed, verdict_of):
    verdict = verdict_of(_greedy(mixed), lambda r: r["choices"][0]["receipt"]["params"].pop("top_p"))
    assert (verdict["verdict"], verdict["exit_code"], verdict["field"]) == ("BAD_RECEIPT", 2, "params.top_p")


def test_a_grammar_constrained_reply_re_executes_in_process_only(engine, tmp_path, capsys):
    body = chat_body("Give a JSON object with a name.", max_tokens=8, **SAMPLED, logprobs=True,
                     response_format={"type": "json_object"})
    with live_server(engine) as live:
        reply = _send(live.url, CHAT, body)
        path = _write(tmp_path, [reply])
        assert cli.main(["verify-receipt", str(path), "--url", live.url]) == Kind.UNVERIFIABLE
    assert "in process only" in capsys.readouterr().out
    assert reply["choices"][0]["receipt"]["params"]["constraint"]["kind"] == "json_object"
    assert _verify(engine, path) == Kind.MATCH  # (the server closed first: one thread drives the engine)


# --- the tiny model: one weight's bit, another template ------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """Replies from a tiny random model, and the weights it was written from."""
    folder = tmp_path_factory.mktemp("tiny")
    spec = TinySpec()
    weights = write_tiny_gguf(folder / "tiny.gguf", spec)
    engine = Engine(EngineConfig(model_path=folder / "tiny.gguf", device="cpu", max_batch=4))
    with live_server(engine) as live:
        chat = _send(live.url, CHAT, {"messages": messages("hello the"), "max_tokens": 6, "temperature": 0,
                                      "logprobs": True, "top_logprobs": 2, "ignore_eos": True})
        text = _send(live.url, COMPLETIONS, {"prompt": "hello", "max_tokens": 6, "temperature": 0, "logprobs": 1,
                                             "ignore_eos": True})
    return {"folder": folder, "spec": spec, "weights": weights, "engine": engine, "chat": chat, "text": text}


def test_a_flipped_bit_in_one_weight_is_named_weights(tiny, verdict_of):
    assert verdict_of(tiny["chat"], host=tiny["engine"])["verdict"] == "MATCH"
    weights = {name: array.copy() for name, array in tiny["weights"].items()}
    first = tiny["chat"]["choices"][0]["receipt"]["output_token_ids"][0]
    weights["output.weight"][first, 0:1].view(np.uint32)[0] ^= np.uint32(1 << 22)  # one mantissa bit of one weight
    write_tiny_gguf(tiny["folder"] / "flipped.gguf", tiny["spec"], weights)
    flipped = Engine(EngineConfig(model_path=tiny["folder"] / "flipped.gguf", device="cpu", max_batch=4))
    verdict = verdict_of(tiny["chat"], host=flipped)
    assert (verdict["verdict"], verdict["exit_code"], verdict["field"]) == ("WEIGHTS", 3, "model.sha256")
    assert verdict["position"] == 0  # that token's logit moved: its first logprob's bits differ


def test_another_template_is_named_template(tiny, verdict_of):
    template = tiny["folder"] / "other.jinja"
    template.write_text("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}")
    other = Engine(EngineConfig(model_path=tiny["folder"] / "tiny.gguf", chat_template=template, device="cpu",
                                max_batch=4))
    verdict = verdict_of(tiny["chat"], host=other)
    assert (verdict["verdict"], verdict["exit_code"], verdict["field"]) == ("TEMPLATE", 6,
                                                                            "model.chat_template_sha256")
    assert verdict["position"] is None  # the same ids re-execute to the same bits: only the template differs
    assert verdict_of(tiny["text"], host=other)["verdict"] == "MATCH"  # no template rendered that prompt


def test_what_cannot_be_read_exits_2_saying_why(engine, tmp_path, capsys):
    assert cli.main(["verify-receipt", str(tmp_path / "missing.json")]) == 2
    assert "no file" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("\n\n")
    assert _verify(engine, tmp_path / "empty.jsonl") == 2
    assert "no receipt in" in capsys.readouterr().err
    assert _verify(engine, _write(tmp_path, [{"object": "chat.completion", "choices": [{"index": 0}]}])) == 2
    assert "receipts.jsonl, choice 0: BAD_RECEIPT receipt: 'receipt': missing" in capsys.readouterr().out
    path = _write(tmp_path, [{"hello": 1}])
    assert cli.main(["verify-receipt", str(path), "--url", "http://127.0.0.1:9", "--model", "x.gguf"]) == 2
    assert "--model or --url" in capsys.readouterr().err
