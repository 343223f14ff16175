"""A token-id prompt on /v1/completions is used exactly as sent, even on a model whose tokenizer
adds BOS to text (Gemma 3): no BOS is prepended, so the prompt count, the echoed entries, the
prompt logprobs and return_token_ids all line up one to one with the ids sent. The same text
sent as text gets the BOS, and equals the ids sent with BOS written by the client.

Skipped where the gemma3-270m package is not installed; in CI, which installs it, they fail instead."""

from pathlib import Path

import pytest

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from tests.helpers.http import post
from tests.helpers.live_server import live_server
from tests.helpers.second_model import gemma_package  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("gemma_package")
BOS = 2
TEXT = "The lighthouse keeper climbed the stairs"
FIELDS = {"max_tokens": 2, "temperature": 0, "echo": True, "logprobs": 1, "prompt_logprobs": 1,
          "return_token_ids": True}


@pytest.fixture(scope="module")
def gemma() -> Engine:
    return Engine(EngineConfig(model_path=Path("gemma3-270m"), device="cpu", max_batch=2, max_model_len=128))


@pytest.fixture(scope="module")
def gemma_server(gemma):
    with live_server(gemma) as live:
        yield live


def complete(url: str, prompt) -> dict:
    reply = post(url, "/v1/completions", {"prompt": prompt, **FIELDS}, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_token_ids_are_used_as_sent_on_a_model_that_adds_bos(gemma, gemma_server):
    ids = gemma.tokenizer.encode(TEXT)
    assert gemma.tokenizer.ids.add_bos and gemma.tokenizer.ids.bos_id == BOS and ids[0] != BOS
    reply = complete(gemma_server.url, ids)
    choice = reply["choices"][0]
    assert reply["usage"]["prompt_tokens"] == len(ids)
    assert choice["prompt_token_ids"] == ids
    assert choice["logprobs"]["tokens"][:len(ids)] == [gemma.tokenizer.token_text(i) for i in ids]
    assert len(choice["logprobs"]["tokens"]) == len(ids) + 2  # the prompt echoed, then the reply
    assert choice["logprobs"]["token_logprobs"][0] is None  # nothing predicts the first id sent
    scored = choice["prompt_logprobs"]
    assert len(scored) == len(ids) and scored[0] is None
    assert all(str(target) in entry for target, entry in zip(ids[1:], scored[1:]))


def test_text_gets_the_bos_and_equals_the_ids_with_the_bos_sent(gemma, gemma_server):
    ids = gemma.tokenizer.encode(TEXT)
    as_text = complete(gemma_server.url, TEXT)
    as_ids = complete(gemma_server.url, [BOS, *ids])
    assert as_text["usage"]["prompt_tokens"] == len(ids) + 1
    assert as_text["choices"][0]["prompt_token_ids"] == [BOS, *ids]
    assert as_ids["choices"] == as_text["choices"]  # every logprob, bit for bit
