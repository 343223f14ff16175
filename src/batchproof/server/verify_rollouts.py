"""POST /v1/verify_rollouts: the rollout notary over HTTP (docs/notary.md). A trainer sends
another engine's rollouts (the records `batchproof verify-rollouts` reads, as a list); each is
scored on this server's weights, all of them as one batch of prompt-scoring sequences, and the
reply is the notary's JSON report. A bad record is a 400 naming it and its field."""

import dataclasses
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field, StrictFloat, StrictInt
from starlette.concurrency import run_in_threadpool

from batchproof.engine.rollout_scoring import SCORING_PARAMS, completion_scores
from batchproof.notary.metrics import Scored, Settings, report
from batchproof.notary.records import RecordError, Rollout, parse_record
from batchproof.server.auth import tenant
from batchproof.server.errors import APIError
from batchproof.server.info import numerics_id
from batchproof.server.plan import Choice, Plan, cache_namespace
from batchproof.server.serving import CLIENT_GONE, collect_choices, submit
from batchproof.server.state import ServerState, parse_body
from batchproof.server.unsupported_fields import Strict

router = APIRouter()

Number = StrictFloat | StrictInt


class VerifyRolloutsRequest(Strict):
    """The records stay raw here: notary/records.py checks each against the vocabulary, with the
    same messages the CLI gives for a file's lines."""

    rollouts: list[object]
    near_tie: Annotated[Number, Field(ge=0)] | None = None
    tis_caps: list[Annotated[Number, Field(gt=0)]] | None = None
    mask_band: Annotated[list[Number], Field(min_length=2, max_length=2)] | None = None


def _parse(body: bytes, state: ServerState, key_id: str | None) -> tuple[list[Rollout], Settings, Plan]:
    req = parse_body(VerifyRolloutsRequest, body)
    front = state.front
    if not req.rollouts:
        raise APIError(400, "'rollouts' must not be empty", param="rollouts")
    if len(req.rollouts) > state.limits.max_choices:
        raise APIError(400, f"'rollouts' holds {len(req.rollouts)}; this server queues at most "
                            f"{state.limits.max_choices} sequences a request (--max-queue)", param="rollouts")
    rollouts = []
    for i, obj in enumerate(req.rollouts):
        try:
            rollout = parse_record(obj, f"rollouts[{i}]", front.tokenizer.vocab_size)
        except RecordError as e:
            raise APIError(400, str(e), param=f"rollouts[{i}].{e.field}") from None
        num = len(rollout.prompt_token_ids) + len(rollout.completion_token_ids)
        if num > front.max_model_len:
            raise APIError(400, f"rollouts[{i}]: prompt and completion hold {num} tokens; this model's context "
                                f"holds {front.max_model_len}", param=f"rollouts[{i}].completion_token_ids")
        rollouts.append(rollout)
    asked = {"near_tie": None if req.near_tie is None else float(req.near_tie),
             "tis_caps": None if req.tis_caps is None else tuple(map(float, req.tis_caps)),
             "mask_band": None if req.mask_band is None else tuple(map(float, req.mask_band))}
    try:
        settings = Settings(**{k: v for k, v in asked.items() if v is not None})
    except ValueError as e:  # only the band can be wrong past validation (it must hold 1)
        raise APIError(400, str(e), param="mask_band") from None
    # Scored in this caller's prefix-cache namespace (a group's shared prompt is computed once).
    params = dataclasses.replace(SCORING_PARAMS, cache_namespace=cache_namespace(state.limits.prefix_cache_scope,
                                                                                 key_id, None))
    plan = Plan(prompts=[r.prompt_token_ids + r.completion_token_ids for r in rollouts],
                choices=[Choice(i, i, params) for i in range(len(rollouts))], include_usage=False)
    return rollouts, settings, plan


@router.post("/v1/verify_rollouts", response_model=None)
async def verify_rollouts(request: Request) -> Response:
    state: ServerState = request.app.state.server
    rollouts, settings, plan = await run_in_threadpool(_parse, await request.body(), state, tenant(request))
    submitted = await submit(state, plan, "verify")
    by_choice = await collect_choices(request, submitted.stream, state.config.request_timeout_s)
    if by_choice is None:
        return Response(status_code=CLIENT_GONE)
    scores = []
    for i, rollout in enumerate(rollouts):
        records = next(o.prompt_records for o in by_choice[i] if o.prompt_records is not None)
        scored = completion_scores(len(rollout.prompt_token_ids), len(rollout.completion_token_ids), records)
        scores.append(Scored(scored.logprobs, scored.top))
    info = state.backend.engine.info()
    engine_info = {"model": state.served_model_name, "model_sha256": info.get("model_sha256"),
                   "numerics_id": numerics_id(info), "dtype": info.get("dtype"), "device": info.get("device")}
    body = await run_in_threadpool(report, rollouts, scores, settings, [], engine_info)
    return JSONResponse(body, headers=submitted.headers)
