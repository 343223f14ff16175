"""Chat's plan: a parsed request's messages checked and rendered with its tools, its output
constraint, and what the engine runs (the Responses route plans through it too)."""

from batchproof.server.chat.messages import chat_prompt_ids, check_messages
from batchproof.server.chat.protocol import ChatCompletionRequest
from batchproof.server.chat.token_space import check_continues, token_prompt
from batchproof.server.errors import APIError
from batchproof.server.request.plan import Plan, Wanted, check_model, check_routed_experts, plan_request
from batchproof.server.request.protocol import check_metadata
from batchproof.server.request.structured import request_constraint
from batchproof.server.state import ServerState
from batchproof.server.tools.choice import ToolPlan, plan_tools


def plan_chat(req: ChatCompletionRequest, state: ServerState, key_id: str | None) -> tuple[Plan, ToolPlan | None]:
    """A parsed chat request -> what the engine runs: the one plan the Responses route shares."""
    check_model(req.model, state.model_name)
    client = state.client
    front = client.front
    check_routed_experts(req.return_routed_experts, client.info)
    prompt_ids = token_prompt(req, front.tokenizer, front.max_model_len)
    if prompt_ids is None and not req.messages:
        raise APIError(400, "'messages' must hold at least one message, got [] (or send 'prompt_token_ids')",
                       param="messages")
    if req.top_logprobs is not None and req.logprobs is not True:
        raise APIError(400, f"'top_logprobs' ({req.top_logprobs}) requires 'logprobs' to be true, "
                            f"got 'logprobs': {req.logprobs}", param="top_logprobs")
    check_metadata(req.metadata)
    # Every count first, each before the work it bounds: messages before rendering, tools (in
    # plan_tools) before their grammar compiles.
    if prompt_ids is None:
        check_messages(front, req.messages)
    tool_plan = plan_tools(req, front.chat_template, front.tokenizer)
    if prompt_ids is None:
        prompt_ids = chat_prompt_ids(client, req.messages, tool_plan)
    if req.continue_from is not None:
        check_continues(prompt_ids, req.continue_from, front.tokenizer, front.max_model_len)
    max_tokens, name = ((req.max_completion_tokens, "max_completion_tokens") if req.max_completion_tokens is not None
                        else (req.max_tokens, "max_tokens"))
    top_logprobs = (req.top_logprobs or 0) if req.logprobs else None
    wanted = Wanted(max_tokens, name, top_logprobs, "top_logprobs", prompt_logprobs=req.prompt_logprobs)
    if tool_plan is not None and tool_plan.constraint is not None:
        constraint = tool_plan.constraint  # required or named: the calls' grammar
    else:
        constraint = request_constraint(req.response_format, req.structured_outputs, front.tokenizer)
    return plan_request(req, front, state.limits, [prompt_ids], wanted, key_id, constraint), tool_plan
