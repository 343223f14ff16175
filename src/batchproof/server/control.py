"""The trainer's control plane, by vLLM's names (docs/weight-versions.md): GET /weight_info and
/is_paused; POST /pause?mode=abort|wait|keep, /resume and /abort_requests."""

from typing import get_args

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, StrictStr

from batchproof.engine.async_engine import PauseMode
from batchproof.server.errors import APIError, shown
from batchproof.server.info import numerics_id
from batchproof.server.state import ServerState, parse_body

router = APIRouter()
MODES = get_args(PauseMode)


def _backend(request: Request, changes: bool):
    """The local engine (a 503 while it loads); a fleet's router answers 501, as for
    load_weights: each replica holds its own weights and queue. Changing anything needs
    --allow-weight-updates (and so an API key), as load_weights does."""
    state: ServerState = request.app.state.server
    if changes and not state.config.allow_weight_updates:
        raise APIError(403, f"{request.url.path} is off: start the server with --allow-weight-updates",
                       type_="permission_error")
    _ = state.client  # a 503 while the model loads or after it failed
    backend = state.backend
    if not backend.supports_weight_updates:
        raise APIError(501, f"{request.url.path} runs on a single engine, not through a fleet's router",
                       type_="not_implemented_error")
    return backend


@router.get("/weight_info")
async def weight_info(request: Request) -> dict:
    """The version served now (a label load_weights set, or the served file's hash), and what
    it names: the model's sha256, the numerics id, where and when it was loaded."""
    backend = _backend(request, changes=False)
    return {**backend.weight_info(), "numerics_id": numerics_id(backend.engine.info())}


@router.get("/is_paused")
async def is_paused(request: Request) -> dict:
    backend = _backend(request, changes=False)
    return {"is_paused": backend.is_paused, "mode": backend.pause_mode}


@router.post("/pause")
async def pause(request: Request, mode: str = "abort") -> dict:
    """vLLM's modes: abort (the default) ends the requests in flight with finish_reason
    "abort"; wait lets them finish; keep holds them where they are (a load_weights then swaps
    mid-generation). New requests wait, queued, until /resume. Answered once done: in wait
    mode, once the last request in flight has finished."""
    if mode not in MODES:
        raise APIError(400, f"invalid value {shown(mode)} for 'mode': one of {', '.join(MODES)}", param="mode")
    num_aborted = await _backend(request, changes=True).pause(mode)
    return {"status": "paused", "mode": mode, "num_aborted": num_aborted}


@router.post("/resume")
async def resume(request: Request) -> dict:
    num_admitted = await _backend(request, changes=True).resume()
    return {"status": "resumed", "num_admitted": num_admitted}


class AbortRequestsRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    # A reply's id (every choice of it) or a choice's engine id; absent or null: every request.
    request_ids: list[StrictStr] | None = None


@router.post("/abort_requests")
async def abort_requests(request: Request) -> dict:
    """End requests in flight (or waiting) with finish_reason "abort", without pausing."""
    backend = _backend(request, changes=True)
    body = await request.body()
    req = parse_body(AbortRequestsRequest, body) if body.strip() else AbortRequestsRequest()
    return {"num_aborted": await backend.abort_requests(req.request_ids)}
