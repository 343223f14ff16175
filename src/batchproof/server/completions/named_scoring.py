"""vLLM's teacher scoring on legacy completions: `prompt_logprob_token_ids` (one row of ids per
prompt position from `prompt_logprob_start`) checked against the prompt, the vocabulary and the
server's --max-logprobs, so a bad row is a 400 naming it before anything runs."""

from batchproof.server.completions.protocol import CompletionRequest
from batchproof.server.errors import APIError, shown

FIELD = "prompt_logprob_token_ids"


def named_rows(req: CompletionRequest, prompts: list[list[int]], vocab_size: int,
               max_logprobs: int) -> tuple[tuple[tuple[int, ...], ...] | None, int]:
    """(rows, start) as the engine takes them, or (None, 0) when the request names no tokens."""
    if req.prompt_logprob_token_ids is None:
        if req.prompt_logprob_start is not None:
            raise APIError(400, "'prompt_logprob_start' is only used with 'prompt_logprob_token_ids'",
                           param="prompt_logprob_start")
        return None, 0
    if req.stream:
        raise APIError(400, f"'{FIELD}' is not available with 'stream': true", param=FIELD)
    if len(prompts) != 1:
        raise APIError(400, f"'{FIELD}' scores one prompt; got {len(prompts)} prompts", param="prompt")
    start = req.prompt_logprob_start or 0
    num_rows = len(prompts[0]) - 1 - start  # row i: the logits at start + i, predicting start + i + 1
    if num_rows < 0:
        raise APIError(400, f"'prompt_logprob_start' {start} is past the prompt's last scored position "
                            f"({len(prompts[0]) - 1} tokens are predicted)", param="prompt_logprob_start")
    rows = req.prompt_logprob_token_ids
    if len(rows) != num_rows:
        raise APIError(400, f"'{FIELD}' has {len(rows)} rows; the prompt's {len(prompts[0])} tokens from "
                            f"'prompt_logprob_start' {start} need exactly {num_rows} (one per position "
                            f"start..{len(prompts[0]) - 2})", param=FIELD)
    for i, row in enumerate(rows):
        if len(row) > max_logprobs:
            raise APIError(400, f"'{FIELD}[{i}]' names {len(row)} ids; this server scores at most {max_logprobs} "
                                f"a row (--max-logprobs)", param=FIELD)
        for j, token_id in enumerate(row):
            if not -1 <= token_id < vocab_size:
                raise APIError(400, f"'{FIELD}[{i}][{j}]' is {shown(token_id)}: not a token id in "
                                    f"0..{vocab_size - 1} (or -1 to pad a row)", param=FIELD)
    return tuple(tuple(row) for row in rows), start
