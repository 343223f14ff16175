"""`batchproof models`: the models batchproof knows by name, installed or not, and how to get each."""

import argparse

from batchproof.engine.model.known_models import DEFAULT_MODEL_NAME, KNOWN_MODELS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    width = max(len(name) for name in KNOWN_MODELS)
    for model in KNOWN_MODELS.values():
        state = "installed" if model.is_installed else f"not installed: {model.pip}"
        default = " (default)" if model.name == DEFAULT_MODEL_NAME else ""
        print(f"{model.name:<{width}}  {state}{default}\n{'':<{width}}  {model.description}")
    print("\nserve one with `batchproof serve --model NAME`, or any GGUF with `--model PATH`")
    return 0
