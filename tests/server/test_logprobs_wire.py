"""Records on the wire: -inf as -9999.0, NaN never ranked, exact bytes, ties to the lower id."""

import json
import math

import torch

from batchproof.common.wire import ABSENT_LOGPROB, dumps
from batchproof.engine.sampling.logprobs import build_records
from batchproof.server.reply.entries import chat_entry

NAN, INF = float("nan"), float("inf")


def test_minus_inf_is_sent_as_minus_9999_and_nan_never_appears(engine) -> None:
    tok = engine.tokenizer
    vocab = tok.vocab_size
    logits = torch.full((1, vocab), -INF)
    logits[0, [10, 20, 30]] = torch.tensor([1.0, 2.0, 2.0])
    logits[0, 40:50] = NAN
    record = build_records(logits, [20], [6], [0])[0]
    entry = json.loads(dumps(chat_entry(tok, record)))  # dumps refuses NaN and infinities
    assert [alt["logprob"] for alt in entry["top_logprobs"]][3:] == [ABSENT_LOGPROB] * 3
    assert [tok.token_text(e.token_id) for e in record.top] == [alt["token"] for alt in entry["top_logprobs"]]
    assert [e.token_id for e in record.top] == [20, 30, 10, 0, 1, 2], "ties to the lower id; NaN never ranked"
    assert math.isclose(entry["logprob"], record.logprob) and entry["logprob"] == entry["top_logprobs"][0]["logprob"]
    assert entry["bytes"] == list(tok.decode_bytes(20))


def test_entry_bytes_are_exact_and_token_is_their_lossy_text(engine) -> None:
    tok = engine.tokenizer
    partial = [10813, 232, 227, 23274, 115]  # pieces of multi-byte characters
    token_ids = [0, 1, 2, *partial, *range(3, tok.vocab_size, 1013)]
    logits = torch.randn(len(token_ids), tok.vocab_size, generator=torch.Generator().manual_seed(0))
    records = build_records(logits, token_ids, [1] * len(token_ids), [0] * len(token_ids))
    expected = torch.log_softmax(logits.double(), -1)
    for row, (token_id, record) in enumerate(zip(token_ids, records)):
        entry = json.loads(dumps(chat_entry(tok, record)))
        assert bytes(entry["bytes"]) == tok.decode_bytes(token_id)
        assert entry["token"] == bytes(entry["bytes"]).decode("utf-8", errors="replace")
        assert math.isclose(entry["logprob"], float(expected[row, token_id]), abs_tol=1e-5)
        assert entry["top_logprobs"][0]["token"] == tok.token_text(int(logits[row].argmax()))
    assert any("\ufffd" in json.loads(dumps(chat_entry(tok, r)))["token"] for r in records[3:8])
