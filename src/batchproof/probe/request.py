"""The request the probe sends, per route: chat completions or legacy completions."""

from typing import Any, Literal

from batchproof.probe.matrix import Matrix

Route = Literal["chat", "completions"]
ROUTES: dict[Route, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
TOP_LOGPROBS = 2


Message = dict[str, str]


def request_body(
    route: Route, prompt: str | list[Message], matrix: Matrix, served_model: str | None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One greedy streamed request with logprobs; only how the prompt and logprobs are asked differs.
    `prompt` is a user message, or a whole conversation (`--cache`'s system prompts and turns);
    `extra` (`--extra-body`) adds a server's own fields, e.g. llama.cpp's `cache_prompt`."""
    body: dict[str, Any] = {} if served_model is None else {"model": served_model}
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    if route == "chat":
        # Chat takes a flag and a count; legacy completions take the count as `logprobs`.
        asked = {"messages": messages, "logprobs": True, "top_logprobs": TOP_LOGPROBS}
    else:
        # Legacy completions have no roles: a conversation is its contents, in order.
        asked = {"prompt": "\n\n".join(m["content"] for m in messages), "logprobs": TOP_LOGPROBS}
    return (extra or {}) | body | asked | {
        "temperature": matrix.temperature,
        "max_tokens": matrix.n_predict,
        "seed": matrix.seed,
        "ignore_eos": matrix.ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
