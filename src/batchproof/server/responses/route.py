"""POST /v1/responses (and GET/DELETE of a stored one): the Responses API as a formatter over
chat's plan (chat/plan.py) and the same runner, so a conversation gets the same tokens and
logprobs through either API. The stored responses (store.py) are this endpoint's own: one store
an app, kept in `app.state` under this endpoint's key (`keep_responses`)."""

from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from batchproof.server.chat.plan import plan_chat
from batchproof.server.chat.protocol import ChatCompletionRequest
from batchproof.server.errors import APIError, shown
from batchproof.server.guards.auth import tenant
from batchproof.server.reply.receipt import ReceiptBook
from batchproof.server.reply.receipt_facts import model_facts
from batchproof.server.request.plan import Plan, logprobs_label
from batchproof.server.request.protocol import check_metadata
from batchproof.server.request.receipt_seeds import seeded, wants_receipts
from batchproof.server.responses.formatter import ResponsesFormatter
from batchproof.server.responses.protocol import ResponsesRequest
from batchproof.server.responses.store import ResponseStore
from batchproof.server.responses.translate import TOKEN_PROMPT, Message, chat_request, input_messages, renamed
from batchproof.server.serving import reply, submit
from batchproof.server.state import ServerState, parse_body
from batchproof.server.tools.choice import ToolPlan

router = APIRouter()


def keep_responses(app: FastAPI) -> None:
    """Give `app` its stored responses (what previous_response_id continues and GET returns):
    created with the app, so they live as long as it does, and a new app starts with none."""
    app.state.responses = ResponseStore()


def _store(request: Request) -> ResponseStore:
    return request.app.state.responses


def _not_found(response_id: str, param: str) -> APIError:
    return APIError(404, f"no stored response has the id {shown(response_id)} (responses are kept in bounded "
                         "memory, per API key, until the server restarts or needs the room)", param=param,
                    code="previous_response_not_found" if param == "previous_response_id" else "not_found")


def _check_num_items(num_items: int, state: ServerState) -> None:
    """Before each item is validated and translated: each (a message, a call, a call's result)
    costs at least one token of the context, as a chat message does."""
    most = state.front.max_model_len
    if num_items > most:
        raise APIError(400, f"'input' (with the stored conversation it continues) holds {num_items} items; at most "
                            f"{most} fit this model's context (each costs at least one token)", param="input")


def _plan(body: bytes, state: ServerState, store: ResponseStore, key_id: str | None
          ) -> tuple[ResponsesRequest, ChatCompletionRequest, Plan, ToolPlan | None, list[Message]]:
    """Parse, translate, render and tokenize: on a worker thread, as the chat route does."""
    req = parse_body(ResponsesRequest, body)
    check_metadata(req.metadata)  # kept with the response: bounded before anything else
    history: list[Message] = []
    if req.previous_response_id is not None:
        stored = store.get(key_id, req.previous_response_id)
        if stored is None:
            raise _not_found(req.previous_response_id, "previous_response_id")
        history = stored.conversation
        if any(TOKEN_PROMPT in message for message in history):
            raise APIError(400, f"the response {shown(req.previous_response_id)} was prompted with 'prompt_token_ids', "
                                "which cannot be re-rendered as messages; continue it in token space "
                                "(prompt_token_ids: its prompt, reply and the next turn)", param="previous_response_id")
    _check_num_items(len(history) + (len(req.input) if isinstance(req.input, list) else 1), state)
    chat, conversation = chat_request(req, history)
    try:
        plan, tool_plan = plan_chat(chat, state, key_id)
    except APIError as error:
        raise renamed(error) from None
    return req, chat, plan, tool_plan, conversation


def _echo(req: ResponsesRequest, response_id: str, model: str) -> dict[str, Any]:
    """The response object's fields that restate the request, defaults filled in as OpenAI's are."""
    text_format = req.text.format if req.text is not None and req.text.format is not None else None
    return {"id": response_id, "model": model, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "metadata": req.metadata or {},
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id, "store": req.store is not False,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "top_p": 1.0 if req.top_p is None else req.top_p, "top_logprobs": req.top_logprobs,
            "tool_choice": req.tool_choice or "auto", "tools": req.tools or [],
            "text": {"format": text_format.model_dump(by_alias=True, exclude_none=True) if text_format
                     else {"type": "text"}},
            "truncation": "disabled", "user": req.user, "background": False,
            "reasoning": {"effort": None, "summary": None}, "service_tier": "default"}


@router.post("/v1/responses", response_model=None)
async def create_response(request: Request) -> Response:
    state: ServerState = request.app.state.server
    key_id = tenant(request)
    store = _store(request)
    req, chat, plan, tool_plan, conversation = await run_in_threadpool(_plan, await request.body(), state, store,
                                                                       key_id)
    receipts = None
    if wants_receipts(req.receipt, state.config.receipts):
        plan = seeded(plan)
        receipts = ReceiptBook(plan, model_facts(state.backend, uses_template=chat.prompt_token_ids is None))
    submitted = await submit(state, plan, "resp", key_id)
    response_id = submitted.request_id.replace("-", "_", 1)  # OpenAI's spelling: resp_<hex>

    def keep(response: dict[str, Any]) -> None:
        store.put(key_id, response, [*conversation, *input_messages(response["output"], "output")])

    formatter = ResponsesFormatter(_echo(req, response_id, state.served_model_name), state.front.tokenizer,
                                   wants_records=chat.logprobs is True, label=logprobs_label(plan.choices[0].params),
                                   tool_plan=tool_plan, on_done=keep if req.store is not False else None,
                                   receipts=receipts)
    return await reply(request, submitted, state.config.request_timeout_s, bool(req.stream), formatter)


@router.get("/v1/responses/{response_id}", response_model=None)
async def get_response(request: Request, response_id: str) -> Response:
    if request.query_params.get("stream", "false").lower() not in ("false", "0"):
        raise APIError(400, "replaying a stored response as a stream is not served; GET it whole", param="stream")
    stored = _store(request).get(tenant(request), response_id)
    if stored is None:
        raise _not_found(response_id, "response_id")
    return Response(stored.response_json, media_type="application/json")  # the bytes held: no decode on the loop


@router.delete("/v1/responses/{response_id}", response_model=None)
async def delete_response(request: Request, response_id: str) -> Response:
    if not _store(request).delete(tenant(request), response_id):
        raise _not_found(response_id, "response_id")
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})
