"""The rollout notary on two engines' rollouts, and its speed: one command.

Samples N rollouts through our own server (`batchproof serve`, logprobs and return_token_ids, as
a trainer takes them) and N with transformers in bfloat16 (SmolLM2-135M from the packaged GGUF,
converted as examples/rl_loop.py does; raw logprobs of the bf16 logits), writes each as the
notary's JSONL, verifies both in-process (`batchproof verify-rollouts`, one engine) and prints
each verdict, rollouts scored per second, and the same sequences' plain prefill rate.

    python examples/notary.py --num 200 --out /tmp/notary     # reports in /tmp/notary/{ours,hf-bf16}/
"""

import argparse
import json
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from batchproof.commands import verify_rollouts
from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.default_model import default_model_path
from batchproof.engine.sampling.params import SamplingParams

PROMPTS = ["Write one sentence about the sea.", "Name three fruits.", "What is 7 times 8?", "Say hello in French.",
           "Describe a cat in five words.", "Give me a colour.", "Why is the sky blue?", "Count to ten."]


def serve() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "batchproof", "serve", "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return server, url
        except httpx.TransportError:
            time.sleep(0.5)
    raise RuntimeError("batchproof serve did not start")


def _groups(num: int) -> list[tuple[str, int, int]]:
    """(prompt, samples, seed) per request: up to 16 samples of one prompt (n), prompts in turn."""
    groups, left = [], num
    while left:
        n = min(16, left)
        groups.append((PROMPTS[len(groups) % len(PROMPTS)], n, len(groups)))
        left -= n
    return groups


def ours(num: int, max_tokens: int) -> list[dict]:
    server, url = serve()
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=3600)
        model = client.models.list().data[0].id

        def sample(group: tuple[str, int, int]) -> list[dict]:
            prompt, n, seed = group
            reply = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": prompt}], n=n, temperature=1.0, seed=seed,
                max_tokens=max_tokens, logprobs=True, extra_body={"return_token_ids": True})
            records = []
            for choice in reply.choices:
                logprobs = [entry.logprob for entry in choice.logprobs.content]
                end = getattr(choice, "end_token", None)  # the end-of-turn token's entry, where one ended it
                if end is not None and len(choice.token_ids) == len(logprobs) + 1:
                    logprobs.append(end["logprob"])
                records.append({"id": f"ours-{seed}-{choice.index}", "prompt_token_ids": reply.prompt_token_ids,
                                "completion_token_ids": choice.token_ids, "logprobs": logprobs})
            return records

        with ThreadPoolExecutor(4) as pool:  # several requests batched together, as a trainer sends them
            return [r for records in pool.map(sample, _groups(num)) for r in records]
    finally:
        server.terminate()
        server.wait(timeout=30)


def transformers_bf16(num: int, max_tokens: int) -> list[dict]:
    """Sampled from the raw bf16 distribution (no top-k/top-p), each token's logprob from its logits."""
    gguf = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # As examples/rl_loop.py converts it: the GGUF dequantized, then a plain model built from its
    # config in bfloat16 (weights and arithmetic), as a trainer or an HF rollout worker holds it.
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    model.load_state_dict(loaded.state_dict())
    del loaded
    torch.manual_seed(0)
    records = []
    for prompt_text, n, seed in _groups(num):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt_text}],
                                               add_generation_prompt=True, tokenize=True, return_dict=False)
        out = model.generate(torch.tensor([prompt]), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=max_tokens, num_return_sequences=n, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=tokenizer.eos_token_id)
        logprobs = torch.log_softmax(torch.stack(out.logits, 1).float(), -1)  # [n, steps, V]
        for j in range(n):
            ids = out.sequences[j, len(prompt):].tolist()
            if tokenizer.eos_token_id in ids:  # keep the end token (sampled too), not the padding after it
                ids = ids[:ids.index(tokenizer.eos_token_id) + 1]
            claimed = logprobs[j, torch.arange(len(ids)), torch.tensor(ids)].tolist()
            records.append({"id": f"hf-bf16-{seed}-{j}", "prompt_token_ids": list(prompt),
                            "completion_token_ids": ids, "logprobs": claimed})
    return records


def prefill_rate(records: list[dict]) -> float:
    """Tokens a second for the same sequences prefilled with nothing scored and nothing cached:
    the engine's plain prefill rate on this machine."""
    engine = Engine(EngineConfig(prefix_cache=False))
    requests = {f"p{i}": (r["prompt_token_ids"] + r["completion_token_ids"], SamplingParams(max_tokens=0))
                for i, r in enumerate(records)}
    started = time.perf_counter()
    engine.generate(requests)
    return sum(len(p) for p, _ in requests.values()) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num", type=int, default=200, help="rollouts from each engine [default: 200]")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("notary-out"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sets = {"ours": ours(args.num, args.max_tokens), "hf-bf16": transformers_bf16(args.num, args.max_tokens)}
    for name, records in sets.items():
        path = args.out / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        engine = Engine(EngineConfig())  # a fresh prefix cache: a set's own shared prompts only
        run = argparse.Namespace(file=path, out=args.out / name, model=None, device="auto", near_tie=0.05,
                                 tis_cap=None, mask_band=(0.5, 2.0), quiet=False)
        started = time.perf_counter()
        verify_rollouts.run(run, engine=engine)
        seconds = time.perf_counter() - started
        del engine
        summary = json.loads((args.out / name / "report.json").read_text())["summary"]
        num_tokens = sum(len(r["prompt_token_ids"]) + len(r["completion_token_ids"]) for r in records)
        rate = prefill_rate(records)
        print(f"{name}: {summary['num_rollouts']} rollouts, exact {summary['num_exact_tokens']}/"
              f"{summary['num_tokens']} tokens, max |delta| {summary['max_abs_diff']:.3g}, k3 {summary['k3_kl']:.3g} | "
              f"verified {len(records) / seconds:.1f} rollouts/s ({num_tokens / seconds:.0f} tokens/s, shared "
              f"prompts cached); plain prefill {rate:.0f} tokens/s, no cache ({num_tokens / seconds / rate:.2f}x)")


if __name__ == "__main__":
    main()
