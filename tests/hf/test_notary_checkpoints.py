"""The notary on a Hugging Face checkpoint: rollouts our engine sampled from it come out exact;
rollouts transformers sampled from the same checkpoint in bfloat16 come out with their real gap
(examples/notary.py does the same on SmolLM2 at 200 + 200)."""

import torch

from batchproof.commands.verify_rollouts import verify
from batchproof.engine.sampling.params import SamplingParams
from batchproof.notary.metrics import Settings
from batchproof.notary.records import parse_record
from tests.hf.test_tiny_checkpoints import engine_on

NUM, MAX_TOKENS = 4, 12


def _ours(engine, prompt: list[int]) -> list[dict]:
    requests = {f"r{i}": (prompt, SamplingParams(temperature=1.0, seed=i, max_tokens=MAX_TOKENS, top_logprobs=0,
                                                 ignore_eos=True)) for i in range(NUM)}
    records = []
    for deltas in engine.generate(requests).values():
        got = [r for d in deltas for r in d.records]
        records.append({"prompt_token_ids": prompt, "completion_token_ids": [r.token_id for r in got],
                        "logprobs": [r.logprob for r in got]})
    return records


def _transformers_bf16(directory, prompt: list[int]) -> list[dict]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16, attn_implementation="eager").eval()
    torch.manual_seed(0)
    out = model.generate(torch.tensor([prompt]), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                         max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, num_return_sequences=NUM,
                         output_logits=True, return_dict_in_generate=True)
    logprobs = torch.log_softmax(torch.stack(out.logits, 1).float(), -1)  # [NUM, steps, V], raw: before sampling
    records = []
    for j in range(NUM):
        ids = out.sequences[j, len(prompt):].tolist()
        records.append({"prompt_token_ids": prompt, "completion_token_ids": ids,
                        "logprobs": logprobs[j, torch.arange(len(ids)), torch.tensor(ids)].tolist()})
    return records


def _report(engine, records: list[dict]) -> dict:
    vocab = engine.tokenizer.vocab_size
    rollouts = [parse_record(r, f"line {i + 1}", vocab) for i, r in enumerate(records)]
    return verify(engine, rollouts, [], Settings(), progress=False)


def test_our_rollouts_are_exact_and_bfloat16_ones_show_their_gap(tiny_checkpoint):
    directory = tiny_checkpoint("llama")
    engine = engine_on(directory)
    prompt = engine.chat_prompt_ids([{"role": "user", "content": "hello there"}])
    ours = _report(engine, _ours(engine, prompt))
    assert ours["summary"]["all_exact"] and ours["summary"]["num_tokens"] == NUM * MAX_TOKENS
    theirs = _report(engine, _transformers_bf16(directory, prompt))
    summary = theirs["summary"]
    assert summary["num_tokens"] == NUM * MAX_TOKENS and not summary["all_exact"]
    # bfloat16's rounding, not another model: a gap well above float32's, well below a wrong model's
    assert 1e-4 < summary["mean_abs_diff"] < 0.5, summary
    assert all(r["first_divergent_position"] is not None for r in theirs["rollouts"])
    assert theirs["frameworks"]["nemo-rl"]["train/gen_kl_error"] > 0
