"""The request the probe sends, per route: chat completions, legacy completions or responses."""

from typing import Any, Literal

from batchproof.probe.matrix import Matrix
from batchproof.probe.records.message import Message

Route = Literal["chat", "completions", "responses"]
ROUTES: dict[Route, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
                            "responses": "/v1/responses"}
RESPONSES_LOGPROBS = "message.output_text.logprobs"
TOP_LOGPROBS = 2


def request_body(
    route: Route, prompt: str | list[Message], matrix: Matrix, served_model: str | None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One greedy streamed request with logprobs; only how the prompt and logprobs are asked differs.
    `prompt` is a user message, or a whole conversation (`--cache`'s system prompts and turns);
    `extra` (`--extra-body`) adds a server's own fields, e.g. llama.cpp's `cache_prompt`."""
    body: dict[str, Any] = {} if served_model is None else {"model": served_model}
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    # Every route's stream carries usage: chat and completions when asked, responses always.
    length: dict[str, Any] = {"max_tokens": matrix.n_predict, "stream_options": {"include_usage": True}}
    if route == "chat":
        # Chat takes a flag and a count; legacy completions take the count as `logprobs`.
        asked = {"messages": messages, "logprobs": True, "top_logprobs": TOP_LOGPROBS}
    elif route == "responses":
        # The Responses API: messages are input items, logprobs an `include`, the length max_output_tokens.
        asked = {"input": messages, "include": [RESPONSES_LOGPROBS], "top_logprobs": TOP_LOGPROBS}
        length = {"max_output_tokens": matrix.n_predict}
    else:
        # Legacy completions have no roles: a conversation is its contents, in order.
        asked = {"prompt": "\n\n".join(m["content"] for m in messages), "logprobs": TOP_LOGPROBS}
    return (extra or {}) | body | asked | length | {
        "temperature": matrix.temperature,
        "seed": matrix.seed,
        "ignore_eos": matrix.ignore_eos,
        "stream": True,
    }
