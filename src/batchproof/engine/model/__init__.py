"""The model: its facts (spec.py), each file format's reader (gguf/, hf/), the one source
picked from the path (source.py), the transformer's forward pass, and the ops it runs on."""
