"""POST /v1/verify_rollouts: the rollout notary over HTTP (docs/notary.md). A trainer sends
another engine's rollouts (the records `batchproof verify-rollouts` reads, as a list); each is
scored on this server's weights, all of them as one batch of prompt-scoring sequences, and the
reply is the notary's JSON report. A bad record is a 400 naming it and its field; every list is
counted before anything is checked (notary/limits.py), so the report's size is bounded too."""

import dataclasses

import numpy as np
import pydantic_core
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import StrictBool, StrictFloat, StrictInt, ValidationError
from starlette.concurrency import run_in_threadpool

from batchproof.engine.model.moe.receipt import replay_error
from batchproof.engine.outputs import RequestOutput
from batchproof.engine.rollout_scoring import (
    ROUTED_SCORING_PARAMS,
    SCORING_PARAMS,
    completion_scores,
    replayed_params,
)
from batchproof.notary.limits import Bounds, TooLarge, check_sizes
from batchproof.notary.metrics import Scored, report
from batchproof.notary.records import RecordError, Rollout, as_float, parse_record
from batchproof.notary.settings import SettingError, Settings
from batchproof.server.errors import APIError, from_validation_error, shown
from batchproof.server.guards.auth import tenant
from batchproof.server.guards.precount import check_structure
from batchproof.server.info import numerics_id
from batchproof.server.reply.json_body import json_reply
from batchproof.server.request.plan import Choice, Plan, cache_namespace
from batchproof.server.request.unsupported_fields import Strict
from batchproof.server.serving import CLIENT_GONE, QUEUE_RETRY_AFTER_S, collect_choices, submit
from batchproof.server.state import ServerState, parse_body

router = APIRouter()

# Any JSON number: whether a float holds it (10**400, 1e400 read as inf, NaN) is checked after,
# so that it is a 400 naming the field rather than an OverflowError.
Number = StrictFloat | StrictInt


class VerifyRolloutsRequest(Strict):
    """The records stay raw here: notary/records.py checks each against the vocabulary, with the
    same messages the CLI gives for a file's lines. Ranges are Settings' (400s naming the field)."""

    rollouts: list[object]
    near_tie: Number | None = None
    tis_caps: list[Number] | None = None
    mask_band: list[Number] | None = None
    replay_routing: StrictBool | None = None  # score claimed MoE routings under them (docs/moe.md)


def _decoded(body: bytes, state: ServerState) -> VerifyRolloutsRequest:
    """The body's lists counted (a 400 naming the first past its limit), then validated. The
    JSON budgets come first, on the raw bytes: 3,000,000 numbers are refused before one is parsed."""
    check_structure(body)
    try:
        decoded = pydantic_core.from_json(body)
    except ValueError:
        return parse_body(VerifyRolloutsRequest, body)  # which names what is wrong with it
    if isinstance(decoded, dict):
        unknown = next((key for key in decoded if key not in VerifyRolloutsRequest.model_fields), None)
        if unknown is not None:  # named before validation, which would list every unknown key
            raise APIError(400, f"'{unknown}' is not a field of /v1/verify_rollouts (its fields: "
                                f"{', '.join(VerifyRolloutsRequest.model_fields)})", param=unknown)
        bounds = Bounds(max_rollouts=state.limits.max_choices, max_tokens=state.front.max_model_len,
                        max_alternatives=state.config.max_logprobs + 1,
                        max_entries=state.config.max_logprob_entries)
        try:
            check_sizes(decoded, bounds)
        except TooLarge as e:
            raise APIError(400, str(e), param=e.field) from None
    try:
        return VerifyRolloutsRequest.model_validate(decoded)
    except ValidationError as e:
        raise from_validation_error(e) from None


def _float(value: int | float, name: str, param: str) -> float:
    number = as_float(value)
    if number is None:
        raise APIError(400, f"'{name}' is {shown(value)}: not a finite number that a float holds", param=param)
    return number


def _settings(req: VerifyRolloutsRequest) -> Settings:
    asked = {}
    if req.near_tie is not None:
        asked["near_tie"] = _float(req.near_tie, "near_tie", "near_tie")
    for name in ("tis_caps", "mask_band"):
        values = getattr(req, name)
        if values is not None:
            asked[name] = tuple(_float(v, f"{name}[{i}]", name) for i, v in enumerate(values))
    if req.replay_routing is not None:
        asked["replay_routing"] = req.replay_routing
    try:
        return Settings(**asked)
    except SettingError as e:
        raise APIError(400, str(e), param=e.field) from None


def _parse(body: bytes, state: ServerState, key_id: str | None) -> tuple[list[Rollout], Settings, Plan]:
    req = _decoded(body, state)
    if not req.rollouts:
        raise APIError(400, "'rollouts' must not be empty", param="rollouts")
    settings = _settings(req)
    rollouts = []
    for i, obj in enumerate(req.rollouts):
        try:
            rollouts.append(parse_record(obj, f"rollouts[{i}]", state.front.tokenizer.vocab_size))
        except RecordError as e:
            raise APIError(400, str(e), param=f"rollouts[{i}].{e.field}") from None
    replayed = _check_routed(rollouts, state, settings.replay_routing)
    # Scored in this caller's prefix-cache namespace (a group's shared prompt is computed once);
    # a rollout that claims its MoE routing gets ours to compare (and computes its prompt whole),
    # or with replay_routing is scored under its own (outside the cache).
    namespace = cache_namespace(state.limits.prefix_cache_scope, key_id, None)
    params = [replayed_params(replayed[i]) if i in replayed
              else dataclasses.replace(ROUTED_SCORING_PARAMS if r.routed_experts is not None else SCORING_PARAMS,
                                       cache_namespace=namespace) for i, r in enumerate(rollouts)]
    plan = Plan(prompts=[r.prompt_token_ids + r.completion_token_ids for r in rollouts],
                choices=[Choice(i, i, params[i]) for i in range(len(rollouts))], include_usage=False)
    return rollouts, settings, plan


def _check_routed(rollouts: list[Rollout], state: ServerState, replay: bool) -> dict[int, np.ndarray]:
    """Claimed routings checked against the model served (a 400 naming the first that cannot be
    its own: on a dense model, any) -> with `replay`, the routings to score under, by rollout."""
    claiming = [i for i, r in enumerate(rollouts) if r.routed_experts is not None]
    if not claiming:
        return {}
    info = state.client.info()
    if not info.get("num_experts"):
        raise APIError(400, f"rollouts[{claiming[0]}] claims 'routed_experts', and the model served "
                            f"({info.get('architecture')}) has no mixture-of-experts layers to route",
                       param=f"rollouts[{claiming[0]}].routed_experts")
    replayed = {}
    for i in claiming if replay else ():
        replayed[i] = np.array(rollouts[i].routed_experts, dtype=np.int64)
        wrong = replay_error(replayed[i], info["num_experts"], info["num_moe_layers"], info["num_experts_used"],
                             len(rollouts[i].prompt_token_ids) + len(rollouts[i].completion_token_ids))
        if wrong:
            raise APIError(400, f"rollouts[{i}].routed_experts cannot be replayed here: {wrong}",
                           param=f"rollouts[{i}].routed_experts")
    return replayed


def _weights_now(state: ServerState) -> dict:
    """The weights served now, named: version, hash and numerics read together (a swap between
    the reads is read again)."""
    backend = state.backend
    control = backend.control  # None: a fleet's replicas, whose weights are never swapped
    while True:
        version = control.weight_info()["weight_version"] if control is not None else None
        info = backend.engine.info()
        if version is None or control.weight_info()["weight_version"] == version:
            break
    return {"model": state.served_model_name, "model_sha256": info.get("model_sha256"),
            "numerics_id": numerics_id(info), "dtype": info.get("dtype"), "device": info.get("device"),
            "weight_version": version}


def weights_that_scored(versions: set[str], served: list[dict]) -> dict:
    """Of the weights served before and after the scoring, those whose version the scoring's
    outputs carry: a drain-mode swap installed as the last rollout finished names the new weights
    after, and the scores are the old ones'. A 503 when no single one scored them all."""
    if len(versions) <= 1:
        for weights in served:
            if not versions or weights["weight_version"] in (None, *versions):  # (None: a fleet, never swapped)
                return {**weights, "weight_version": next(iter(versions), weights["weight_version"])}
    # Versions apart (a keep-mode swap refilled some rollouts), or none served before or after (two swaps).
    raise APIError(503, f"the weights changed while these rollouts were scored (by {sorted(versions)}, served "
                        f"{[w['weight_version'] for w in served]}); send them again", type_="service_unavailable",
                   code="weights_changed", headers={"Retry-After": str(QUEUE_RETRY_AFTER_S)})


def scored(rollouts: list[Rollout], by_choice: dict[int, list[RequestOutput]]
           ) -> tuple[list[Rollout], list[Scored], list[Rollout], set[str]]:
    """Each rollout's outputs -> the rollouts scored and their scores, those an abort ended
    before they were scored (collect_choices lets only /abort_requests and /pause through), and
    the weight versions that scored them."""
    kept, scores, aborted, versions = [], [], [], set()
    for i, rollout in enumerate(rollouts):
        outputs = by_choice[i]
        first = next((o for o in outputs if o.prompt_records is not None), None)
        if first is None:
            if outputs[-1].finish_reason != "abort":
                raise RuntimeError(f"{rollout.where} ended ({outputs[-1].finish_reason}) without its scores")
            aborted.append(rollout)
            continue
        result = completion_scores(len(rollout.prompt_token_ids), len(rollout.completion_token_ids),
                                   first.prompt_records, outputs[-1].routed_experts)
        kept.append(rollout)
        scores.append(Scored(result.logprobs, result.top, result.routes))
        versions.add(first.weight_version)
    return kept, scores, aborted, versions - {""}


@router.post("/v1/verify_rollouts", response_model=None)
async def verify_rollouts(request: Request) -> Response:
    state: ServerState = request.app.state.server
    rollouts, settings, plan = await run_in_threadpool(_parse, await request.body(), state, tenant(request))
    before = _weights_now(state)
    submitted = await submit(state, plan, "verify", tenant(request))
    by_choice = await collect_choices(request, submitted.stream, state.config.request_timeout_s)
    if by_choice is None:  # the client left: closing the stream aborted every sequence, and no report is built
        return Response(status_code=CLIENT_GONE)
    kept, scores, aborted, versions = scored(rollouts, by_choice)
    engine_info = weights_that_scored(versions, [before, _weights_now(state)])
    # Built and encoded off the event loop: the bounded report is still megabytes at the limit.
    return await json_reply(lambda: report(kept, scores, settings, [], engine_info, aborted),
                            headers=submitted.headers)
