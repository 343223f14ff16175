"""A Hugging Face checkpoint directory, side by side: config.json to hyperparameters (config.py),
its tensor names (names.py), the safetensors read and checked (checkpoint.py), its tokenizer and
chat template (tokenizer.py) and the source the engine asks (source.py)."""
