"""lm-evaluation-harness, run unchanged against our server: `local-completions` with its default
arguments (the server's own tokenizer, token-id prompts) on a multiple-choice task and a
generate_until task, and `local-chat-completions` generation. Its log-likelihoods equal the
values our engine computes directly, and its generations equal the engine's greedy text.

Data and task files are committed in tests/evaluation/; the hub is switched off."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from batchproof.engine.sampling.params import SamplingParams

pytest.importorskip("lm_eval")

ROOT = Path(__file__).resolve().parents[2]
TASKS = "tests/evaluation/tasks"
UNTIL = ["\n", ".", "Question:", "Answer:", "###"]  # batchproof_gen.yaml
MAX_GEN_TOKS = 12


def _run_lm_eval(url: str, model: str, tasks: str, out: Path, *extra: str) -> dict[str, list[dict]]:
    """`lm_eval` as a user runs it; every logged sample, by task."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HOME": str(out / "hf"), "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "lm_eval", "--model", model, "--model_args", f"base_url={url}",
               "--tasks", tasks, "--include_path", TASKS, "--output_path", str(out / "results"), "--log_samples",
               "--limit", "2", *extra]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    samples: dict[str, list[dict]] = {}
    for path in (out / "results").rglob("samples_*.jsonl"):
        task = path.name.removeprefix("samples_").rsplit("_", 1)[0]
        samples[task] = [json.loads(line) for line in path.read_text().splitlines()]
    return samples


def _encode_pair(engine, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """As lm-eval's TemplateLM._encode_pair: trailing spaces move to the continuation, the whole is
    encoded and split (the remote tokenizer adds no special tokens)."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = engine.tokenizer.encode(context + continuation)
    context_len = len(engine.tokenizer.encode(context))
    return whole[:context_len], whole[context_len:]


def _engine_loglikelihood(engine, context: str, continuation: str) -> float:
    context_ids, continuation_ids = _encode_pair(engine, context, continuation)
    params = SamplingParams(temperature=0.0, max_tokens=0, prompt_logprobs=0)
    (out,) = engine.generate({"ll": (context_ids + continuation_ids, params)})["ll"]
    return sum(record.logprob for record in out.prompt_records[len(context_ids):])


def _engine_greedy(engine, prompt_ids: list[int], stop: list[str]) -> str:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_GEN_TOKS, stop=tuple(stop))
    return "".join(out.text for out in engine.generate({"gen": (prompt_ids, params)})["gen"])


@pytest.fixture(scope="module")
def completions_samples(server, tmp_path_factory) -> dict[str, list[dict]]:
    return _run_lm_eval(server.url + "/v1/completions", "local-completions", "batchproof_mc,batchproof_gen",
                        tmp_path_factory.mktemp("lm_eval"))


def test_local_completions_log_likelihoods_equal_the_engine(server, engine, completions_samples) -> None:
    samples = completions_samples["batchproof_mc"]
    assert len(samples) == 2
    # lm-eval has finished: the server is idle, so the engine may be driven directly here.
    for sample in samples:
        for args, resp in zip(sample["arguments"].values(), sample["resps"]):
            loglikelihood, _ = resp[0]
            assert float(loglikelihood) == _engine_loglikelihood(engine, args["arg_0"], args["arg_1"])
        assert sample["acc"] in (0.0, 1.0)


def test_local_completions_generate_until_equals_the_engine(server, engine, completions_samples) -> None:
    samples = completions_samples["batchproof_gen"]
    assert len(samples) == 2
    eos = engine.tokenizer.spelling(engine.tokenizer.ids.eos_id)  # lm-eval adds the EOS to `until`
    for sample in samples:
        context = sample["arguments"]["gen_args_0"]["arg_0"]
        expected = _engine_greedy(engine, engine.tokenizer.encode(context), UNTIL + [eos])
        assert sample["resps"] == [[expected]] and expected


def test_local_chat_completions_generates(server, engine, tmp_path) -> None:
    samples = _run_lm_eval(server.url + "/v1/chat/completions", "local-chat-completions", "batchproof_gen",
                           tmp_path, "--apply_chat_template")["batchproof_gen"]
    assert len(samples) == 2
    for sample in samples:
        (chat,) = sample["arguments"]["gen_args_0"]["arg_0"]  # lm-eval logs the chat it sent, as JSON
        messages = json.loads(chat)
        assert messages[-1]["role"] == "user"
        expected = _engine_greedy(engine, engine.chat_prompt_ids(messages), UNTIL[:4])  # chat: stop[:4]
        assert sample["resps"] == [[expected]] and expected
