"""POST /v1/chat/completions: parse, plan, submit, and format (streamed or whole)."""

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from batchproof.server.auth import tenant
from batchproof.server.errors import APIError
from batchproof.server.formatting.chat import ChatFormatter
from batchproof.server.messages import chat_prompt_ids, check_messages
from batchproof.server.plan import Plan, Wanted, check_model, logprobs_label, plan_request
from batchproof.server.protocol import ChatCompletionRequest, check_metadata
from batchproof.server.serving import reply, submit
from batchproof.server.state import ServerState, parse_body
from batchproof.server.structured import request_constraint
from batchproof.server.tools.choice import ToolPlan, plan_tools

router = APIRouter()


def _plan(body: bytes, state: ServerState, key_id: str | None
          ) -> tuple[ChatCompletionRequest, Plan, ToolPlan | None]:
    """Parse, render and tokenize: on a worker thread (a maximal body takes seconds)."""
    req = parse_body(ChatCompletionRequest, body)
    return (req, *plan_chat(req, state, key_id))


def plan_chat(req: ChatCompletionRequest, state: ServerState, key_id: str | None) -> tuple[Plan, ToolPlan | None]:
    """A parsed chat request -> what the engine runs: the one plan the Responses route shares."""
    check_model(req.model, state.served_model_name)
    if not req.messages:
        raise APIError(400, "'messages' must hold at least one message, got []", param="messages")
    if req.top_logprobs is not None and req.logprobs is not True:
        raise APIError(400, f"'top_logprobs' ({req.top_logprobs}) requires 'logprobs' to be true, "
                            f"got 'logprobs': {req.logprobs}", param="top_logprobs")
    check_metadata(req.metadata)
    client = state.client
    front = client.front
    # Every count first, each before the work it bounds: messages before rendering, tools (in
    # plan_tools) before their grammar compiles.
    check_messages(front, req.messages)
    tool_plan = plan_tools(req, front.chat_template, front.tokenizer)
    prompt_ids = chat_prompt_ids(client, req.messages, tool_plan)
    max_tokens, name = ((req.max_completion_tokens, "max_completion_tokens") if req.max_completion_tokens is not None
                        else (req.max_tokens, "max_tokens"))
    top_logprobs = (req.top_logprobs or 0) if req.logprobs else None
    wanted = Wanted(max_tokens, name, top_logprobs, "top_logprobs", prompt_logprobs=req.prompt_logprobs)
    if tool_plan is not None and tool_plan.constraint is not None:
        constraint = tool_plan.constraint  # required or named: the calls' grammar
    else:
        constraint = request_constraint(req.response_format, req.structured_outputs, front.tokenizer)
    return plan_request(req, front, state.limits, [prompt_ids], wanted, key_id, constraint), tool_plan


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(request: Request) -> Response:
    state: ServerState = request.app.state.server
    req, plan, tool_plan = await run_in_threadpool(_plan, await request.body(), state, tenant(request))
    submitted = await submit(state, plan, "chatcmpl")
    formatter = ChatFormatter(submitted.request_id, state.served_model_name, state.front.tokenizer, len(plan.choices),
                              wants_records=req.logprobs is True, include_usage=plan.include_usage,
                              prompt_ids=plan.prompts[0], num_prompt_logprobs=req.prompt_logprobs,
                              label=logprobs_label(plan.choices[0].params), tool_plan=tool_plan,
                              return_token_ids=bool(req.return_token_ids))
    return await reply(request, submitted, state.config.request_timeout_s, bool(req.stream), formatter)
