"""Engine records in OpenAI's wire shapes: chat logprob entries, legacy logprobs, token ids, usage."""

from batchproof.common.wire import wire_logprob
from batchproof.engine.logprobs import TokenRecord
from batchproof.engine.sequence import RequestOutput
from batchproof.engine.text.tokenizer import Tokenizer, incremental_utf8_decoder
from batchproof.server.errors import APIError


def _token(tokenizer: Tokenizer, token_id: int) -> tuple[str, list[int]]:
    raw = tokenizer.decode_bytes(token_id)
    return raw.decode("utf-8", errors="replace"), list(raw)


def chat_entry(tokenizer: Tokenizer, record: TokenRecord) -> dict:
    text, raw = _token(tokenizer, record.token_id)
    top = []
    for alt in record.top:
        alt_text, alt_raw = _token(tokenizer, alt.token_id)
        top.append({"token": alt_text, "logprob": wire_logprob(alt.logprob), "bytes": alt_raw})
    return {"token": text, "logprob": wire_logprob(record.logprob), "bytes": raw, "top_logprobs": top}


class TextOffsets:
    """Where each token starts in the returned text, in characters (legacy `text_offset`).

    A token that only begins a multi-byte character starts where that character will.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._decoder = incremental_utf8_decoder()
        self._chars = 0

    def next(self, token_id: int) -> int:
        offset = self._chars
        self._chars += len(self._decoder.decode(self._tokenizer.decode_bytes(token_id)))
        return offset


def legacy_logprobs(tokenizer: Tokenizer, records: list[TokenRecord | None], token_ids: list[int],
                    offsets: TextOffsets, top_n: int | None = None) -> dict:
    """The /v1/completions shape; a None record (the first prompt token) scores as null.
    top_n: how many alternatives to show (records may hold more, kept for prompt_logprobs)."""
    tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
    for token_id, record in zip(token_ids, records):
        tokens.append(_token(tokenizer, token_id)[0])
        text_offset.append(offsets.next(token_id))
        if record is None:
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        token_logprobs.append(wire_logprob(record.logprob))
        top_logprobs.append({_token(tokenizer, alt.token_id)[0]: wire_logprob(alt.logprob)
                             for alt in record.top[:top_n]})
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": text_offset}


def prompt_logprobs(tokenizer: Tokenizer, prompt_ids: list[int], records: list[TokenRecord | None],
                    top_n: int) -> list[dict | None]:
    """vLLM's `prompt_logprobs`: per prompt token, null for the first, else {id: {logprob, rank,
    decoded_token}} for the token itself, then its top_n alternatives. rank is the 1-based place in
    our order (ties to the lower id), null when the token is outside the alternatives kept."""
    result: list[dict | None] = []
    for token_id, record in zip(prompt_ids, records):
        if record is None:
            result.append(None)
            continue
        rank = next((r + 1 for r, alt in enumerate(record.top) if alt.token_id == token_id), None)
        entry = {str(token_id): {"logprob": wire_logprob(record.logprob), "rank": rank,
                                 "decoded_token": _token(tokenizer, token_id)[0]}}
        for r, alt in enumerate(record.top[:top_n]):
            entry.setdefault(str(alt.token_id), {"logprob": wire_logprob(alt.logprob), "rank": r + 1,
                                                 "decoded_token": _token(tokenizer, alt.token_id)[0]})
        result.append(entry)
    return result


def usage(num_prompt: int, num_completion: int, num_cached: int = 0) -> dict:
    """As OpenAI's: prompt_tokens_details.cached_tokens counts prompt tokens the prefix cache served."""
    return {"prompt_tokens": num_prompt, "completion_tokens": num_completion,
            "total_tokens": num_prompt + num_completion, "prompt_tokens_details": {"cached_tokens": num_cached}}


def summed_usage(lasts: list[RequestOutput], n: int) -> dict:
    """Usage of a request's choices (each one's last delta, in index order): each prompt counted
    once (its n choices share it; the first choice's cache hits count), every choice's completion counted."""
    return usage(sum(out.num_prompt_tokens for out in lasts[::n]), sum(out.num_output_tokens for out in lasts),
                 sum(out.num_cached_tokens for out in lasts[::n]))


def ids_mismatch(num_ids: int, num_tokens: int) -> APIError:
    """Fail closed, as logprobs do: a reply whose token ids do not number its tokens is never a 200
    (a trainer would score other tokens than those the reply's logprobs describe)."""
    return APIError(500, f"token_ids fail closed: {num_ids} ids for {num_tokens} reply tokens", type_="server_error")


def reply_token_ids(outputs: list[RequestOutput]) -> list[int]:
    """vLLM's `token_ids`: one choice's generated ids over all its deltas (the end-of-turn token
    is no part of the reply, as in its logprobs and usage)."""
    ids = [token_id for out in outputs for token_id in out.token_ids]
    if len(ids) != outputs[-1].num_kept_tokens:
        raise ids_mismatch(len(ids), outputs[-1].num_kept_tokens)
    return ids
