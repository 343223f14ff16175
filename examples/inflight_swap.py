"""The in-flight (keep-mode) weight swap, end to end: rollouts cut by a swap, and the proof that
each token belongs to exactly one policy.

Serves the default model with --allow-weight-updates, starts N streamed chat rollouts (sampled,
a seed each, logprobs and return_token_ids), and once the first has made --swap-at tokens swaps
in "step-1" (the default model's file with its output norm scaled: the same shapes, other
numbers, as a trainer's next checkpoint) with `mode: keep`, no pause. Each rollout's
`weight_version_spans` say which tokens step-0 and step-1 chose. Then it re-scores every rollout
(prompt + reply as one prompt, echo) under step-1, swaps step-0 back and re-scores under it, and
prints, per rollout, the cut and the largest difference on each side: 0 and 0 is the guarantee
(docs/rl-rollouts.md, "In-flight weight swaps").

    python examples/inflight_swap.py --rollouts 4 --max-tokens 48 --swap-at 12
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import gguf
import httpx
import numpy as np

from batchproof.engine.model.known_models import resolve_model

KEY = "inflight-swap-example"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPTS = ["Tell me about the sea.", "Describe a forest at dawn.", "Write about a city in the rain.",
           "What does a baker do all day?"]


def checkpoints(root: Path) -> None:
    """step-0.gguf (the default model) and step-1.gguf (its output norm scaled by 1.25)."""
    shutil.copyfile(resolve_model(None), root / "step-0.gguf")
    shutil.copyfile(root / "step-0.gguf", root / "step-1.gguf")
    reader = gguf.GGUFReader(root / "step-1.gguf", "r+")
    norm = next(t for t in reader.tensors if t.name == "output_norm.weight")
    norm.data[:] = norm.data * np.float32(1.25)
    reader.data.flush()


def serve(root: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "batchproof", "serve", "--model", str(root / "step-0.gguf"),
                               "--allow-weight-updates", "--port", str(port)],
                              env={**os.environ, "BATCHPROOF_ADMIN_API_KEY": KEY})
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return server, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError("batchproof serve did not start")


class Rollout(threading.Thread):
    """One streamed chat rollout; `num_tokens` counts what has arrived so far."""

    def __init__(self, url: str, prompt: str, seed: int, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.body = {"messages": [{"role": "user", "content": prompt}], "stream": True, "logprobs": True,
                     "temperature": 1.0, "seed": seed, "max_tokens": max_tokens, "ignore_eos": True,
                     "return_token_ids": True}
        self.prompt_ids: list[int] = []
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.spans: list[dict] = []
        self.num_tokens = 0

    def run(self) -> None:
        with httpx.stream("POST", f"{self.url}/v1/chat/completions", json=self.body, headers=AUTH,
                          timeout=600) as response:
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: "):])
                for choice in chunk["choices"]:
                    self.prompt_ids = (self.prompt_ids or chunk.get("prompt_token_ids")
                                       or choice.get("prompt_token_ids") or [])
                    self.token_ids += choice.get("token_ids", [])
                    self.logprobs += [entry["logprob"] for entry in (choice.get("logprobs") or {}).get("content", [])]
                    self.spans += choice.get("weight_version_spans", [])
                self.num_tokens = len(self.token_ids)

    def joined_spans(self) -> list[tuple[int, int, str]]:
        """The stream's spans end to end, one per version."""
        joined: list[list] = []
        for span in self.spans:
            if joined and joined[-1][2] == span["version"]:
                joined[-1][1] = span["end"]
            else:
                joined.append([span["start"], span["end"], span["version"]])
        return [tuple(span) for span in joined]


def rescored(url: str, prompt_ids: list[int], token_ids: list[int]) -> list[float]:
    """The reply's tokens scored as one prompt by the weights served now."""
    reply = httpx.post(f"{url}/v1/completions", headers=AUTH, timeout=600,
                       json={"prompt": prompt_ids + token_ids, "echo": True, "max_tokens": 0, "logprobs": 0})
    reply.raise_for_status()
    return reply.json()["choices"][0]["logprobs"]["token_logprobs"][len(prompt_ids):]


def load(url: str, path: str, version: str, mode: str) -> dict:
    reply = httpx.post(f"{url}/v1/load_weights", headers=AUTH, timeout=600,
                       json={"path": path, "weight_version": version, "mode": mode})
    reply.raise_for_status()
    return reply.json()


def max_gap(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--swap-at", type=int, default=12, help="swap once the first rollout has this many tokens")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        checkpoints(root)
        server, url = serve(root)
        try:
            load(url, "step-0.gguf", "step-0", "drain")  # label the served weights as the trainer does
            rollouts = [Rollout(url, PROMPTS[i % len(PROMPTS)], seed=i, max_tokens=args.max_tokens)
                        for i in range(args.rollouts)]
            for rollout in rollouts:
                rollout.start()
            while rollouts[0].num_tokens < args.swap_at and rollouts[0].is_alive():
                time.sleep(0.02)
            swap = load(url, "step-1.gguf", "step-1", "keep")
            print(f"swapped to step-1 mid-generation: {swap['num_refilled']} sequences re-prefilled, "
                  f"load {swap['load_s']:.2f} s, swap {swap['swap_s']:.3f} s")
            for rollout in rollouts:
                rollout.join()
            under_new = [rescored(url, r.prompt_ids, r.token_ids) for r in rollouts]
            load(url, "step-0.gguf", "step-0", "drain")
            under_old = [rescored(url, r.prompt_ids, r.token_ids) for r in rollouts]
            exact = True
            for i, (rollout, new, old) in enumerate(zip(rollouts, under_new, under_old, strict=True)):
                spans = rollout.joined_spans()
                cut = spans[0][1] if spans[0][2] == "step-0" else 0
                before = max_gap(rollout.logprobs[:cut], old[:cut])
                after = max_gap(rollout.logprobs[cut:], new[cut:])
                exact = exact and before == 0 and after == 0
                changed = max_gap(old[cut:], new[cut:])  # what the swap changed: the two policies' numbers
                print(f"rollout {i}: spans {spans} | tokens 0..{cut} vs step-0 re-scored: max |diff| {before:g} | "
                      f"tokens {cut}..{len(rollout.token_ids)} vs step-1 re-scored: max |diff| {after:g} "
                      f"(step-0 vs step-1 there: {changed:.3g})")
            print("every token equals its own policy's re-scoring, bit for bit" if exact else "NOT EXACT")
            return 0 if exact else 1
        finally:
            server.terminate()
            server.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
