"""Token-space conversations (docs/rl-rollouts.md): a chat prompt sent as ids (vLLM's
`prompt_token_ids` beside `messages: []`), and `continue_from`, the previous turn's prompt and
reply ids, which the new prompt must extend exactly. Multi-turn rollouts break silently when a
re-rendered template re-tokenises the previous reply into other ids (verl #6719, slime #117,
prime-rl #1352): the trainer then scores tokens the policy never chose. Here that is a 400
naming the first index that differs, never a 200 on other ids."""

from batchproof.engine.text.tokenizer import Tokenizer
from batchproof.server.chat.protocol import ChatCompletionRequest, Continuation
from batchproof.server.errors import APIError, shown

CONTEXT_TOKENS = 8  # template text shown on each side of a divergence: enough to see which turn marker


def check_ids(ids: list[int], tokenizer: Tokenizer, name: str, max_len: int, is_empty_ok: bool = False) -> list[int]:
    """A list of ids inside the vocabulary (non-empty unless `is_empty_ok`), no longer than the
    context: else a 400 naming `name` and the first bad value."""
    if not ids and not is_empty_ok:
        raise APIError(400, f"'{name}' must not be empty, got []", param=name.split(".")[0])
    for i, token_id in enumerate(ids):
        if not 0 <= token_id < tokenizer.vocab_size:
            raise APIError(400, f"'{name}[{i}]' is {token_id}, not a token id in 0..{tokenizer.vocab_size - 1}",
                           param=name.split(".")[0])
    if len(ids) > max_len:
        raise APIError(400, f"'{name}' has {len(ids)} tokens; this model's maximum context length is {max_len} "
                            "tokens", param=name.split(".")[0])
    return list(ids)


def token_prompt(req: ChatCompletionRequest, tokenizer: Tokenizer, max_len: int) -> list[int] | None:
    """The prompt sent as ids (used as given: the caller rendered it), or None for messages.
    One of the two, as vLLM takes them: `messages: []` beside the ids."""
    if req.prompt_token_ids is None:
        return None
    if req.messages:
        raise APIError(400, f"'messages' must be [] when 'prompt_token_ids' is given (the ids are the whole prompt), "
                            f"got {len(req.messages)} messages", param="messages")
    return check_ids(req.prompt_token_ids, tokenizer, "prompt_token_ids", max_len)


def _around(tokenizer: Tokenizer, ids: list[int], at: int) -> str:
    """The text of the ids around index `at`, with `|` where `at` begins."""
    before = tokenizer.decode(ids[max(0, at - CONTEXT_TOKENS):at])
    after = tokenizer.decode(ids[at:at + CONTEXT_TOKENS])
    return shown(f"{before}|{after}")


def check_continues(prompt_ids: list[int], previous: Continuation, tokenizer: Tokenizer, max_len: int) -> None:
    """The new prompt must begin with the previous prompt + reply ids, id for id: else a 400
    naming the first index that differs and the text on each side there. The reply's ids may be
    none: a real reply can have no tokens (a stop string that cut it at its first token)."""
    before = (check_ids(previous.prompt_token_ids, tokenizer, "continue_from.prompt_token_ids", max_len)
              + check_ids(previous.token_ids, tokenizer, "continue_from.token_ids", max_len, is_empty_ok=True))
    at = next((i for i, (old, new) in enumerate(zip(before, prompt_ids)) if old != new), None)
    if at is None and len(prompt_ids) >= len(before):
        return
    if at is None:  # the new prompt stops inside the previous turn
        raise APIError(400, f"the new prompt does not extend 'continue_from': it has {len(prompt_ids)} tokens, the "
                            f"previous prompt and reply {len(before)}; it ends at index {len(prompt_ids)}, before "
                            f"{_around(tokenizer, before, len(prompt_ids))}", param="continue_from")
    raise APIError(400, f"the new prompt does not extend 'continue_from' at index {at}: the previous turn has "
                        f"id {before[at]} there ({_around(tokenizer, before, at)}), the rendered prompt id "
                        f"{prompt_ids[at]} ({_around(tokenizer, prompt_ids, at)}); the template (or the text "
                        "sent back for the reply) renders other tokens than the ones generated", param="continue_from")
