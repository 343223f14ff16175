"""POST /v1/completions: the legacy shape, with echo, prompt scoring (max_tokens 0) and every
prompt shape OpenAI allows (a string, strings, token ids, lists of token ids)."""

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from batchproof.server.completions.formatter import CompletionsFormatter, CompletionsShape
from batchproof.server.completions.plan import plan_completions
from batchproof.server.completions.protocol import CompletionRequest
from batchproof.server.guards.auth import tenant
from batchproof.server.reply.receipt import ReceiptBook
from batchproof.server.reply.receipt_facts import model_facts
from batchproof.server.request.plan import Plan, logprobs_label
from batchproof.server.request.receipt_seeds import seeded, wants_receipts
from batchproof.server.serving import reply, submit
from batchproof.server.state import ServerState, parse_body

router = APIRouter()


def _plan(body: bytes, state: ServerState, key_id: str | None) -> tuple[CompletionRequest, Plan]:
    """Parse and tokenize: on a worker thread (a maximal body takes seconds)."""
    req = parse_body(CompletionRequest, body)
    return req, plan_completions(req, state, key_id)


def _named_rows(plan: Plan) -> tuple[int, int] | None:
    """(prompt_logprob_start, rows) when the request named tokens to score."""
    params = plan.choices[0].params
    rows = params.prompt_logprob_token_ids
    return None if rows is None else (params.prompt_logprob_start, len(rows))


@router.post("/v1/completions", response_model=None)
async def completions(request: Request) -> Response:
    state: ServerState = request.app.state.server
    req, plan = await run_in_threadpool(_plan, await request.body(), state, tenant(request))
    receipts = None
    if wants_receipts(req.receipt, state.config.receipts):  # a text prompt is tokenized: no template
        plan = seeded(plan)
        receipts = ReceiptBook(plan, model_facts(state.backend, uses_template=False))
    submitted = await submit(state, plan, "cmpl", tenant(request))
    shape = CompletionsShape(num_logprobs=req.logprobs, echo=bool(req.echo),
                             num_prompt_logprobs=req.prompt_logprobs, include_usage=plan.include_usage,
                             label=logprobs_label(plan.choices[0].params),
                             return_token_ids=bool(req.return_token_ids),
                             as_ids=bool(req.return_tokens_as_token_ids), named_rows=_named_rows(plan))
    formatter = CompletionsFormatter(submitted.request_id, state.served_model_name, state.front.tokenizer,
                                     plan.prompts, len(plan.choices) // len(plan.prompts), shape, receipts)
    return await reply(request, submitted, state.config.request_timeout_s, bool(req.stream), formatter)
