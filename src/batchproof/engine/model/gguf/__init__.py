"""A GGUF file, side by side: the container (reader.py), its tensor names (names.py), every key
and tensor checked (validate.py), the model read from it (file.py), its tokenizer (tokenizer.py,
spm_tokenizer.py) and the source the engine asks (source.py)."""
