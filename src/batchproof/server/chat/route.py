"""POST /v1/chat/completions: parse, plan, submit, and format (streamed or whole)."""

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from batchproof.server.chat.formatter import ChatFormatter, ChatShape
from batchproof.server.chat.plan import plan_chat
from batchproof.server.chat.protocol import ChatCompletionRequest
from batchproof.server.guards.auth import tenant
from batchproof.server.reply.receipt import ReceiptBook
from batchproof.server.reply.receipt_facts import model_facts
from batchproof.server.request.plan import Plan, logprobs_label
from batchproof.server.request.receipt_seeds import seeded, wants_receipts
from batchproof.server.serving import reply, submit
from batchproof.server.state import ServerState, parse_body
from batchproof.server.tools.choice import ToolPlan

router = APIRouter()


def _plan(body: bytes, state: ServerState, key_id: str | None
          ) -> tuple[ChatCompletionRequest, Plan, ToolPlan | None]:
    """Parse, render and tokenize: on a worker thread (a maximal body takes seconds)."""
    req = parse_body(ChatCompletionRequest, body)
    return (req, *plan_chat(req, state, key_id))


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(request: Request) -> Response:
    state: ServerState = request.app.state.server
    req, plan, tool_plan = await run_in_threadpool(_plan, await request.body(), state, tenant(request))
    receipts = None
    if wants_receipts(req.receipt, state.config.receipts):
        plan = seeded(plan)
        receipts = ReceiptBook(plan, model_facts(state.backend, uses_template=req.prompt_token_ids is None))
    submitted = await submit(state, plan, "chatcmpl", tenant(request))
    shape = ChatShape(wants_records=req.logprobs is True, include_usage=plan.include_usage,
                      num_prompt_logprobs=req.prompt_logprobs, label=logprobs_label(plan.choices[0].params),
                      tool_plan=tool_plan, return_token_ids=bool(req.return_token_ids),
                      as_ids=bool(req.return_tokens_as_token_ids))
    formatter = ChatFormatter(submitted.request_id, state.served_model_name, state.front.tokenizer, plan.prompts[0],
                              len(plan.choices), shape, receipts)
    return await reply(request, submitted, state.config.request_timeout_s, bool(req.stream), formatter)
