"""POST /v1/load_weights: replace the served weights in place (docs/hf-checkpoints.md,
docs/weight-versions.md), through the backend's WeightControl; a path is read only under
--weights-root (weights_root.py)."""

from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictStr
from starlette.concurrency import run_in_threadpool

from batchproof.engine.model.errors import ModelLoadError
from batchproof.server.errors import APIError
from batchproof.server.guards.auth import require_admin
from batchproof.server.info import numerics_id
from batchproof.server.state import ServerState, parse_body
from batchproof.server.trainer.control import local_control
from batchproof.server.trainer.weights_root import not_loadable, weights_path

router = APIRouter()


class LoadWeightsRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    path: StrictStr  # a checkpoint directory (or GGUF) on the server's machine
    # The label every reply's tokens will carry (vLLM's name); default: the checkpoint's hash, short.
    weight_version: StrictStr | None = Field(None, min_length=1, max_length=256)
    # drain: requests in flight finish on the old weights first; keep: they go on under the new
    # ones after feeding their prefix again (as while paused in keep mode). docs/weight-versions.md
    mode: Literal["drain", "keep"] = "drain"


@router.post("/v1/load_weights")
async def load_weights(request: Request) -> dict:
    """Replace the weights in place (docs/hf-checkpoints.md): off unless --allow-weight-updates,
    which needs an admin key, and only that key may; only under --weights-root. Requests admitted
    before the swap finish on the old weights; a checkpoint that cannot replace them is a 400 and
    the old weights keep serving."""
    state: ServerState = request.app.state.server
    if not state.config.allow_weight_updates:
        raise APIError(403, "weight updates are off: start the server with --allow-weight-updates",
                       type_="permission_error")
    require_admin(request)
    control = local_control(state, "load_weights")  # a 503 while the model loads; a fleet's router: 501
    req = parse_body(LoadWeightsRequest, await request.body())
    if not req.path.strip():
        raise APIError(400, "'path' is empty", param="path")
    # Resolving stats files: off the event loop, as a slow disk must not stall every stream.
    path = await run_in_threadpool(weights_path, state.weights_root, req.path)
    try:
        swap = await control.load_weights(path, req.weight_version, keep=req.mode == "keep")
    except ModelLoadError as e:
        raise APIError(400, f"'path' cannot replace the served weights: {e}", param="path") from None
    except OSError:  # a file could not be opened: said as every other file system state is
        raise not_loadable(req.path) from None
    info = state.client.info()
    return {"object": "load_weights", "path": info["model_path"], "model_sha256": info["model_sha256"],
            "numerics_id": numerics_id(info), "load_s": round(swap.load_s, 4), "drain_s": round(swap.drain_s, 4),
            "swap_s": round(swap.swap_s, 4), "weight_version": state.client.weight_version, "mode": swap.mode,
            "num_refilled": swap.num_refilled}
