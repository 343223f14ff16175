"""Helpers the tests share: live and scripted servers, tiny GGUF files, HTTP and check fixtures."""
