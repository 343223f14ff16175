"""The arithmetic the model and the logprobs run on, chosen once at load."""

import torch

from batchproof.engine.model.ops import kernels
from batchproof.engine.model.ops.base import HeadLayout, Ops, RopeTables
from batchproof.engine.model.ops.kernel_ops import KernelOps
from batchproof.engine.model.ops.torch_ops import TorchOps

__all__ = ["HeadLayout", "KernelOps", "Ops", "RopeTables", "TorchOps", "choose_ops"]


def choose_ops(device: torch.device, dtype: torch.dtype, is_batch_invariant: bool, num_threads: int,
               numerics: str = "float32", max_isa: str = "auto") -> Ops:
    """Invariant: our fixed-order kernels where they apply (float32 on CPU, built), else
    torch padded to a fixed row count. Not invariant: plain torch, rows as they come. The int8
    numerics exists only in our kernels: asked for elsewhere, it is an error, never a silent
    float path."""
    if is_batch_invariant and kernels.available() and device.type == "cpu" and dtype == torch.float32:
        if max_isa != "auto":  # process-wide, set before the kernels' name is read; speed only
            kernels.cap_isa_level(kernels.ISA_LEVELS[max_isa])
        return KernelOps(num_threads, numerics=numerics)
    if numerics != "float32":
        raise ValueError(f"numerics {numerics} runs on our CPU kernels only (float32 dtype, batch-invariant, "
                         f"built); this engine would run torch on {device.type}")
    return TorchOps(padded=is_batch_invariant, device=device)
