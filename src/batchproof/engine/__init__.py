"""The engine: model files, tokenizer, chat template, forward pass and kernels, scheduler,
sampler, logprobs. It never imports the server.

`from batchproof.engine import Engine, EngineConfig, SamplingParams` is the public face;
the names load on first use, so reading the config (as the CLI does to build its flags)
does not import torch.
"""

import importlib

_PUBLIC = {
    "Engine": "batchproof.engine.engine",
    "BatchSummary": "batchproof.engine.engine",
    "EngineConfig": "batchproof.engine.config",
    "SamplingParams": "batchproof.engine.sampling_params",
    "RequestOutput": "batchproof.engine.sequence",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'batchproof.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
