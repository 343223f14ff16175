"""The trainer's control plane, by vLLM's names (docs/weight-versions.md): GET /weight_info and
/is_paused; POST /pause?mode=abort|wait|keep, /resume and /abort_requests. Changes are the admin
key's, but for a tenant's abort of its own requests. Each runs through the backend's
WeightControl (engine_client.py), and is a 501 where the backend has none (a fleet's router)."""

from typing import get_args

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, StrictStr

from batchproof.engine.async_engine import PauseMode
from batchproof.server.engine_client import WeightControl
from batchproof.server.errors import APIError, shown
from batchproof.server.guards.auth import is_admin, require_admin, tenant
from batchproof.server.info import numerics_id
from batchproof.server.state import ServerState, parse_body

router = APIRouter()
MODES = get_args(PauseMode)


def local_control(state: ServerState, what: str) -> WeightControl:
    """The backend's weight control (a 503 while the model loads or after it failed); a 501 where
    it has none, before a body is read: a fleet's router, whose replicas each hold their own
    weights and queue. `what` names the route in the message."""
    _ = state.client  # a 503 while the model loads or after it failed
    control = state.backend.control
    if control is None:
        raise APIError(501, f"{what} runs on a single engine, not through a fleet's router",
                       type_="not_implemented_error")
    return control


def _control(request: Request, changes: bool, is_admin_only: bool = False) -> WeightControl:
    """The local engine's control, as for load_weights. Changing anything needs
    --allow-weight-updates (and so an admin key), as load_weights does; what touches every
    tenant's requests needs the admin key itself."""
    state: ServerState = request.app.state.server
    if changes and not state.config.allow_weight_updates:
        raise APIError(403, f"{request.url.path} is off: start the server with --allow-weight-updates",
                       type_="permission_error")
    if is_admin_only:
        require_admin(request)
    return local_control(state, request.url.path)


@router.get("/weight_info")
async def weight_info(request: Request) -> dict:
    """The version served now (a label load_weights set, or the served file's hash), and what
    it names: the model's sha256, the numerics id, where and when it was loaded."""
    control = _control(request, changes=False)
    return {**control.weight_info(), "numerics_id": numerics_id(request.app.state.server.client.info())}


@router.get("/is_paused")
async def is_paused(request: Request) -> dict:
    control = _control(request, changes=False)
    return {"is_paused": control.is_paused, "mode": control.pause_mode}


@router.post("/pause")
async def pause(request: Request, mode: str = "abort") -> dict:
    """vLLM's modes: abort (the default) ends the requests in flight with finish_reason
    "abort"; wait lets them finish; keep holds them where they are (a load_weights then swaps
    mid-generation). New requests wait, queued, until /resume. Answered once done: in wait
    mode, once the last request in flight has finished."""
    if mode not in MODES:
        raise APIError(400, f"invalid value {shown(mode)} for 'mode': one of {', '.join(MODES)}", param="mode")
    num_aborted = await _control(request, changes=True, is_admin_only=True).pause(mode)
    return {"status": "paused", "mode": mode, "num_aborted": num_aborted}


@router.post("/resume")
async def resume(request: Request) -> dict:
    num_admitted = await _control(request, changes=True, is_admin_only=True).resume()
    return {"status": "resumed", "num_admitted": num_admitted}


class AbortRequestsRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    # A reply's id (every choice of it) or a choice's engine id; absent or null: every request.
    request_ids: list[StrictStr] | None = None


@router.post("/abort_requests")
async def abort_requests(request: Request) -> dict:
    """End requests in flight (or waiting) with finish_reason "abort", without pausing: anyone's
    with the admin key; with a tenant's, only requests that key sent (without ids: all of them;
    an id of another's: a 403, and nothing is aborted; an id of no request in flight: not counted,
    as for the admin)."""
    control = _control(request, changes=True)
    body = await request.body()
    req = parse_body(AbortRequestsRequest, body) if body.strip() else AbortRequestsRequest()
    request_ids = req.request_ids
    if not is_admin(request):
        request_ids = _own(request, request_ids)
    return {"num_aborted": await control.abort_requests(request_ids)}


def _own(request: Request, request_ids: list[str] | None) -> list[str]:
    """The ids of `request_ids` (None: every request) that the tenant sending `request` sent."""
    owners = request.app.state.server.owners
    if request_ids is None:
        return owners.owned_by(tenant(request))
    mine, theirs = owners.split(tenant(request), request_ids)
    # A 403, not a silent 0: the caller holds the id already (they are uuid4s), so naming whose it
    # is tells nothing new, and a 0 would hide the mistake.
    if theirs:
        raise APIError(403, f"{request.url.path}: {shown(theirs[0])} is another API key's request; only the "
                            "admin API key (--admin-api-key) aborts others' requests", type_="permission_error",
                       param="request_ids")
    return mine
