"""The model: reading GGUF files, the transformer's forward pass, and the ops it runs on."""
