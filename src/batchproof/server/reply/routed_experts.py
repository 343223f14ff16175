"""A choice's routing receipt as vLLM returns it (docs/moe.md): `routed_experts`, the base64 of
the .npy bytes of an array [positions, MoE layers, k] (uint8 up to 256 experts), the experts each
fed position (the prompt's, then the reply's but its last) was routed to. On the whole choice,
and on a stream's last chunk of that choice: the engine hands it over with the last output."""

import base64
import io

import numpy as np

from batchproof.engine.outputs import RequestOutput


def encoded(routes: np.ndarray) -> str:
    """What `np.load(io.BytesIO(base64.b64decode(s)))` reads back."""
    buffer = io.BytesIO()
    np.save(buffer, routes, allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def routed_experts(out: RequestOutput) -> dict[str, str]:
    """The field for a choice (or chunk) whose output `out` is: nothing unless it carries a receipt."""
    return {} if out.routed_experts is None else {"routed_experts": encoded(out.routed_experts)}
