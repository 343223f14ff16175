"""The prompts of `--mixed`: a built-in set of different lengths, or a user's file."""

import json
from pathlib import Path

# Short and long interleaved, so every band of c >= 2 mixes prompt lengths (and with them
# prefill lengths, KV lengths and whatever kernel a server picks by the batch's shape).
BUILTIN_PROMPTS: tuple[str, ...] = (
    "Write an essay on compilers.",
    "Explain, step by step and with one worked example for each step, how a hash table handles "
    "collisions with open addressing, and when it should grow.",
    "Hi.",
    "List five rivers in Europe and the seas they flow into.",
    "A train leaves a station at 9:00 travelling at 80 km/h; a second train leaves the same station "
    "at 10:00 on the same track at 100 km/h. When and where does the second catch the first? "
    "Show your reasoning.",
    "What is a prime number?",
    "Summarise the plot of Hamlet in a short paragraph.",
    "Describe the water cycle to a ten-year-old, covering evaporation, condensation, precipitation "
    "and collection, and end with a question they could investigate at home.",
    "Translate 'good morning' into French, German and Spanish.",
    "Why is the sky blue?",
    "Write a short poem about autumn leaves falling in a quiet park.",
    "Compare TCP and UDP: reliability, ordering, connection set-up, overhead and typical uses. "
    "Give one application that fits each protocol better and say why.",
    "Name three uses of a paperclip.",
    "Give a recipe for pancakes.",
    "You are a tour guide in Rome. Plan a one-day walking route through the city centre that "
    "visits at least five famous sights, with rough times and where to stop for lunch.",
    "What does a CPU cache do?",
)


class PromptsError(ValueError):
    """A prompts file that cannot be used; the message names the flag, the file and the line."""


def parse_prompt_line(line: str, where: str) -> str:
    """One line: plain text, or JSONL (a JSON string, or an object with a string `prompt`)."""
    text = line.strip()
    if not text.startswith(("{", '"')):
        return text
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise PromptsError(f"{where}: not valid JSON ({err.msg})") from None
    if isinstance(value, dict):
        value = value.get("prompt")
    if not isinstance(value, str) or not value.strip():
        raise PromptsError(f"{where}: a JSON line must be a non-empty string or have a non-empty string `prompt`")
    return value


def load_prompts(path: Path) -> tuple[str, ...]:
    """The prompts in `path`, one a line (blank lines skipped)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as err:
        raise PromptsError(f"--prompts {path}: cannot be read ({err.strerror})") from None
    except UnicodeDecodeError:
        raise PromptsError(f"--prompts {path}: not UTF-8 text") from None
    prompts = [
        parse_prompt_line(line, f"--prompts {path} line {n}")
        for n, line in enumerate(text.splitlines(), start=1)
        if line.strip()
    ]
    if not prompts:
        raise PromptsError(f"--prompts {path}: no prompts in the file")
    return tuple(prompts)
