"""A few steps of a minimal policy-gradient (REINFORCE, group baseline) loop with batchproof as
the rollout server and a `transformers` copy of the same model as the trainer
(docs/rl-rollouts.md).

    python examples/rl_loop.py [--steps 3] [--workdir DIR] [--url http://127.0.0.1:8080]

It converts the default model (SmolLM2-135M-Instruct's GGUF) to a float32 Hugging Face
checkpoint, serves it (`batchproof serve --model DIR --allow-weight-updates`, with a fresh admin
key in $BATCHPROOF_ADMIN_API_KEY; or, with --url, a server already started that way, its admin key
in $BATCHPROOF_ADMIN_API_KEY), and each step: samples completions with logprobs and their
token ids, rewards each one (toy: how many times it writes the letter "e"), re-scores the same
ids on the server (/v1/completions, echo) and in the trainer's float32 forward, takes two SGD
steps, writes the checkpoint and swaps it in with POST /v1/load_weights. It prints two gaps per
step: rollout vs re-score (0: the guarantee) and rollout vs trainer (float rounding: other kernels).
Needs transformers and accelerate; a few minutes on a laptop CPU.
"""

import argparse
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from batchproof.engine.model.default_model import default_model_path

PROMPT = "Write one sentence about the sea."
NUM_SAMPLES = 4
MAX_TOKENS = 12


def convert_default_model(directory: Path) -> AutoModelForCausalLM:
    """The GGUF as a float32 checkpoint: transformers dequantizes it, and its state dict goes into
    a model built from the config (a GGUF-loaded model refuses save_pretrained)."""
    gguf = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    del config.quantization_config  # the weights saved are plain floats
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model


def start_server(checkpoint: Path, key: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # load_weights reads files on the server's machine: it needs the admin key (kept out of `ps`),
    # which also serves the rollouts.
    server = subprocess.Popen([sys.executable, "-m", "batchproof", "serve", "--model", str(checkpoint),
                               "--allow-weight-updates", "--port", str(port)],
                              env={**os.environ, "BATCHPROOF_ADMIN_API_KEY": key})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return server, url
        except httpx.TransportError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("batchproof serve did not start")
        time.sleep(0.5)


def load_weights(url: str, key: str, checkpoint: Path) -> dict:
    reply = httpx.post(f"{url}/v1/load_weights", json={"path": str(checkpoint.resolve())},
                       headers={"Authorization": f"Bearer {key}"}, timeout=600)
    reply.raise_for_status()
    return reply.json()


Rollouts = tuple[list[int], list[list[int]], list[list[float]], list[str]]


def sample(client: openai.OpenAI, model: str, seed: int) -> Rollouts:
    """NUM_SAMPLES replies -> (prompt ids, each reply's token ids, their logprobs, their texts)."""
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], n=NUM_SAMPLES, temperature=1.0, seed=seed,
        max_tokens=MAX_TOKENS, logprobs=True, extra_body={"return_token_ids": True})
    choices = reply.choices
    return (reply.prompt_token_ids, [c.token_ids for c in choices], [reply_logprobs(c) for c in choices],
            [c.message.content for c in choices])


def reply_logprobs(choice) -> list[float]:
    """One logprob per id in `token_ids`: the text's entries, then the end-of-turn token's where it
    ended the reply (its entry rides on `end_token`; its id ends `token_ids`), so the trainer also
    learns the decision to stop."""
    logprobs = [entry.logprob for entry in choice.logprobs.content]
    end = getattr(choice, "end_token", None)
    if end is not None:
        logprobs.append(end["logprob"])
    return logprobs


def rescore(client: openai.OpenAI, model: str, prompt_ids: list[int], token_ids: list[list[int]]) -> list[list[float]]:
    """The same ids scored afterwards: prompt + reply as one prompt each, echo, no new token."""
    scored = client.completions.create(model=model, prompt=[prompt_ids + ids for ids in token_ids], echo=True,
                                       max_tokens=0, logprobs=0)
    return [c.logprobs.token_logprobs[len(prompt_ids):] for c in scored.choices]


def policy_logprobs(model: AutoModelForCausalLM, prompt_ids: list[int], token_ids: list[list[int]]
                    ) -> list[torch.Tensor]:
    """The trainer's float32 logprob of each reply's tokens, with gradients: all replies in one
    forward, right-padded (a causal model's real positions never see the padding after them)."""
    width = len(prompt_ids) + max(map(len, token_ids))
    ids = torch.tensor([prompt_ids + t + [0] * (width - len(prompt_ids) - len(t)) for t in token_ids])
    logprobs = torch.log_softmax(model(ids).logits.float(), dim=-1)  # [B, width, V]: position j predicts j + 1
    start = len(prompt_ids) - 1
    return [logprobs[b, start:start + len(t)].gather(-1, torch.tensor(t)[:, None]).squeeze(-1)
            for b, t in enumerate(token_ids)]


def max_gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for row_a, row_b in zip(a, b, strict=True) for x, y in zip(row_a, row_b, strict=True))


def train_step(model: AutoModelForCausalLM, optimizer: torch.optim.Optimizer, prompt_ids: list[int],
               token_ids: list[list[int]], rewards: torch.Tensor, num_sgd_steps: int = 2) -> None:
    # Group baseline (as GRPO): each reply's advantage is its reward against the group's.
    advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
    for _ in range(num_sgd_steps):
        optimizer.zero_grad()
        logprobs = policy_logprobs(model, prompt_ids, token_ids)
        loss = -sum(a * lp.sum() for a, lp in zip(advantages, logprobs))
        (loss / len(token_ids)).backward()
        optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--workdir", type=Path, default=None, help="where the checkpoints go (default: a temp dir)")
    parser.add_argument("--url", default=None, help="a server started with --allow-weight-updates (default: start one)")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rl_loop-"))
    torch.manual_seed(0)

    started = time.perf_counter()
    model = convert_default_model(workdir / "step-0")
    print(f"converted the default model to {workdir / 'step-0'} in {time.perf_counter() - started:.0f} s")
    key = os.environ["BATCHPROOF_ADMIN_API_KEY"] if args.url else secrets.token_hex(16)
    server, url = (None, args.url) if args.url else start_server(workdir / "step-0", key)
    if args.url:
        load_weights(url, key, workdir / "step-0")  # the trainer's weights, whatever it served before
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key)
    served = client.models.list().data[0].id
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    try:
        for step in range(args.steps):
            step_started = time.perf_counter()
            prompt_ids, token_ids, logprobs, texts = sample(client, served, seed=step)
            rescore_gap = max_gap(logprobs, rescore(client, served, prompt_ids, token_ids))
            model.eval()
            with torch.no_grad():
                trainer = [lp.tolist() for lp in policy_logprobs(model, prompt_ids, token_ids)]
            rewards = torch.tensor([float(text.count("e")) for text in texts])
            model.train()
            train_step(model, optimizer, prompt_ids, token_ids, rewards)
            model.save_pretrained(workdir / f"step-{step + 1}")
            swap = load_weights(url, key, workdir / f"step-{step + 1}")
            print(f"step {step}: mean reward {rewards.mean():.2f}, {sum(map(len, token_ids))} tokens | "
                  f"rollout vs rescore: max |diff| {rescore_gap:.3g} | rollout vs trainer (float32): max |diff| "
                  f"{max_gap(logprobs, trainer):.3g} | load_weights {swap['load_s']:.2f} s, "
                  f"numerics_id {swap['numerics_id'][:12]} | {time.perf_counter() - step_started:.0f} s")
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
