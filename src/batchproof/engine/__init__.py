"""The engine: the step loop here (scheduler, runner, sampler, logprobs, outputs); the model
(model/: its facts, each format's reader, the forward pass and kernels), its text (text/:
tokenizer, chat templates, the text stream) and its caches (cache/) below. It never imports
the server.

`from batchproof.engine import Engine, EngineConfig, SamplingParams` is the public face;
the names load on first use, so reading the config (as the CLI does to build its flags)
does not import torch.
"""

import importlib

_PUBLIC = {
    "Engine": "batchproof.engine.engine",
    "BatchSummary": "batchproof.engine.engine",
    "EngineConfig": "batchproof.engine.config",
    "SamplingParams": "batchproof.engine.sampling.params",
    "RequestOutput": "batchproof.engine.outputs",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'batchproof.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
