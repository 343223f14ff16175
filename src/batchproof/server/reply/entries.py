"""Engine records in OpenAI's wire shapes: chat logprob entries, legacy logprobs, token ids, usage."""

import functools

from batchproof.common.log_add import log_add
from batchproof.common.wire import wire_logprob
from batchproof.engine.outputs import RequestOutput
from batchproof.engine.sampling.logprobs import TokenRecord
from batchproof.engine.text.tokenizer import Tokenizer, incremental_utf8_decoder
from batchproof.server.errors import APIError


def _token(tokenizer: Tokenizer, token_id: int) -> tuple[str, list[int]]:
    raw = tokenizer.decode_bytes(token_id)
    return raw.decode("utf-8", errors="replace"), list(raw)


def _spelled(tokenizer: Tokenizer, token_id: int, as_ids: bool) -> tuple[str, list[int]]:
    """A token's text, or vLLM's `token_id:N` spelling of it (return_tokens_as_token_ids: a
    token that is not valid UTF-8 alone, or whose text two ids share, is still named exactly);
    `bytes` stay the token's own either way."""
    text, raw = _token(tokenizer, token_id)
    return (f"token_id:{token_id}" if as_ids else text), raw


def chat_entry(tokenizer: Tokenizer, record: TokenRecord, as_ids: bool = False) -> dict:
    text, raw = _spelled(tokenizer, record.token_id, as_ids)
    top = []
    for alt in record.top:
        alt_text, alt_raw = _spelled(tokenizer, alt.token_id, as_ids)
        top.append({"token": alt_text, "logprob": wire_logprob(alt.logprob), "bytes": alt_raw})
    entry = {"token": text, "logprob": wire_logprob(record.logprob), "bytes": raw, "top_logprobs": top}
    if record.tail is not None:  # return_tail_logprobs: the mass outside top_logprobs (api-fields.md)
        entry["tail_logprob"] = wire_logprob(record.tail)
    return entry


def end_entry(tokenizer: Tokenizer, out: RequestOutput, as_ids: bool = False) -> dict | None:
    """The `end_token` of a choice (docs/rl-rollouts.md): the end-of-turn/EOS token that ended the
    reply, as a chat entry with its id, from the last delta; None when no end token ended it
    (a stop string, the length, a grammar that completed) or no logprobs were recorded."""
    if out.end_token_id is None or out.end_record is None:
        return None
    return {"token_id": out.end_token_id, **chat_entry(tokenizer, out.end_record, as_ids)}


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
                    offsets: TextOffsets, top_n: int | None = None, as_ids: bool = False) -> dict:
    """The /v1/completions shape; a None record (the first prompt token) scores as null.
    top_n: how many alternatives to show (records may hold more, kept for prompt_logprobs);
    as_ids: tokens spelled `token_id:N` (vLLM's return_tokens_as_token_ids)."""
    tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
    for token_id, record in zip(token_ids, records):
        tokens.append(_spelled(tokenizer, token_id, as_ids)[0])
        text_offset.append(offsets.next(token_id))
        if record is None:
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        token_logprobs.append(wire_logprob(record.logprob))
        top_logprobs.append({_spelled(tokenizer, alt.token_id, as_ids)[0]: wire_logprob(alt.logprob)
                             for alt in record.top[:top_n]})
    result = {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
              "text_offset": text_offset}
    if any(record is not None and record.tail is not None for record in records):
        # return_tail_logprobs: per token, the mass outside the alternatives shown (top_n of them)
        result["tail_logprobs"] = [None if record is None else wire_logprob(_tail(record, top_n))
                                   for record in records]
    return result


def _tail(record: TokenRecord, top_n: int | None) -> float:
    """The record's tail, outside the top_n alternatives shown: the records may hold more than
    are shown (kept for prompt_logprobs), and those not shown join the tail, added to it in
    probability (their logprobs are exact; log-add-exp keeps the tail's small values)."""
    hidden = record.top[top_n:] if top_n is not None else ()
    return functools.reduce(log_add, (alt.logprob for alt in hidden), record.tail)


def prompt_token_id_logprobs(records: list[TokenRecord | None] | None, start: int,
                             num_rows: int) -> list[list[float]] | None:
    """vLLM's `prompt_token_id_logprobs`: row i the logprobs of the ids named for the logits at
    prompt position start + i (which predict token start + i + 1), in the named order; -inf
    (a -1 pad) as ABSENT_LOGPROB. None (null) for a prompt never scored: aborted before its
    prefill completed, its reply ends with finish_reason "abort" and no rows."""
    if records is None:
        return None
    rows = [records[start + 1 + i].named for i in range(num_rows)]
    return [[wire_logprob(v) for v in row] for row in rows]


def prompt_logprobs(tokenizer: Tokenizer, prompt_ids: list[int], records: list[TokenRecord | None] | None,
                    top_n: int) -> list[dict | None] | None:
    """vLLM's `prompt_logprobs`: per prompt token, null for the first, else {id: {logprob, rank,
    decoded_token}} for the token itself, then its top_n alternatives. rank is the 1-based place in
    our order (ties to the lower id), null when the token is outside the alternatives kept.
    None (null) for a prompt never scored (aborted before its prefill completed)."""
    if records is None:
        return None
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


def delta_token_ids(out: RequestOutput) -> list[int]:
    """The ids a delta carries: its tokens', then the end-of-turn/EOS token that ended the reply
    (on the last delta), as vLLM's `token_ids` end with it: a trainer trains on the decision to
    stop, and prompt + token_ids re-scored gives that token's logprob too."""
    return out.token_ids if out.end_token_id is None else [*out.token_ids, out.end_token_id]


def reply_token_ids(outputs: list[RequestOutput]) -> list[int]:
    """vLLM's `token_ids`: one choice's generated ids over all its deltas, the end token last."""
    ids = [token_id for out in outputs for token_id in out.token_ids]
    if len(ids) != outputs[-1].num_kept_tokens:
        raise ids_mismatch(len(ids), outputs[-1].num_kept_tokens)
    return ids if outputs[-1].end_token_id is None else [*ids, outputs[-1].end_token_id]
