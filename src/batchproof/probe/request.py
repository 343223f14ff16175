"""The request the probe sends, per route: chat completions or legacy completions."""

from typing import Any, Literal

from batchproof.probe.matrix import Matrix

Route = Literal["chat", "completions"]
ROUTES: dict[Route, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
TOP_LOGPROBS = 2


def request_body(route: Route, prompt: str, matrix: Matrix, served_model: str | None) -> dict[str, Any]:
    """One greedy streamed request with logprobs; only how the prompt and logprobs are asked differs."""
    body: dict[str, Any] = {} if served_model is None else {"model": served_model}
    if route == "chat":
        # Chat takes a flag and a count; legacy completions take the count as `logprobs`.
        asked = {"messages": [{"role": "user", "content": prompt}], "logprobs": True, "top_logprobs": TOP_LOGPROBS}
    else:
        asked = {"prompt": prompt, "logprobs": TOP_LOGPROBS}
    return body | asked | {
        "temperature": matrix.temperature,
        "max_tokens": matrix.n_predict,
        "seed": matrix.seed,
        "ignore_eos": matrix.ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
