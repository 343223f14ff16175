"""A receipt's format: what one reply's bits depend on and what they were (docs/receipts.md,
receipt.schema.json beside this file). The server and the verifier both build theirs here, so a
re-executed reply and the original are written by one function and compared field by field."""

import hashlib
import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass

# 2: prompt scoring (prompt_logprobs, echo, prompt_token_id_logprobs) in the params and its own
# digest, prompt_logprobs_sha256. Version 1 receipts (no prompt scoring) are still read: their
# params and checksums are those fields less the new ones (shape.py, prompt_scoring below).
VERSION = 2
VERSIONS = (1, 2)

# One generated token's logprobs, as its record holds them: (its id, its logprob, its
# alternatives as (id, logprob) best first, the tail's logprob or None when not asked for).
Entry = tuple[int, float, tuple[tuple[int, float], ...], float | None]
# One scored prompt position's: an Entry's four, then the logprobs of the ids a teacher named for
# its row (prompt_logprob_token_ids, -inf for a -1 pad) or None where it named none.
PromptEntry = tuple[int, float, tuple[tuple[int, float], ...], float | None, tuple[float, ...] | None]
PROMPT_PARAMS = ("prompt_logprobs", "prompt_logprob_token_ids", "prompt_logprob_start")


def canonical(value: object) -> bytes:
    """JSON with sorted keys and no spaces: one byte string per value, whoever wrote it."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def checksum(value: object) -> str:
    return hashlib.sha256(canonical(value)).hexdigest()


# The params that are numbers with a fraction: checksummed as floats, so a receipt rewritten by a
# JSON library that spells 1.0 as 1 (JavaScript's) still checks.
FLOAT_PARAMS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
                "logit_bias")


def params_checksum(params: dict) -> str:
    floats = {name: float(params[name]) for name in FLOAT_PARAMS if name != "logit_bias"}
    bias = {token_id: float(value) for token_id, value in params["logit_bias"].items()}
    return checksum({**params, **floats, "logit_bias": bias})


def logprobs_sha256(entries: Iterable[Entry]) -> str:
    """sha256 over each entry's bits in reply order (the end token's last): its id as a big-endian
    int64, its logprob as a big-endian IEEE float64 (the float32 the engine computed, widened
    exactly; -inf as itself), the number of alternatives as a uint32, each alternative's id and
    logprob the same way, then 0x00 without a tail or 0x01 and the tail's float64."""
    digest = hashlib.sha256()
    for entry in entries:
        digest.update(_entry_bytes(*entry))
    return digest.hexdigest()


def _entry_bytes(token_id: int, logprob: float, top: tuple[tuple[int, float], ...], tail: float | None) -> bytes:
    alternatives = b"".join(struct.pack(">qd", alt_id, alt_logprob) for alt_id, alt_logprob in top)
    return (struct.pack(">qdI", token_id, logprob, len(top)) + alternatives
            + (b"\x00" if tail is None else b"\x01" + struct.pack(">d", tail)))


def prompt_logprobs_sha256(entries: Iterable[PromptEntry]) -> str:
    """sha256 over each scored prompt position's bits in prompt order (positions 1 on: nothing
    scores the first): its four values as logprobs_sha256 writes an entry, then 0x00 where no ids
    were named for its row, or 0x01, their number as a uint32 and each logprob as a float64."""
    digest = hashlib.sha256()
    for token_id, logprob, top, tail, named in entries:
        digest.update(_entry_bytes(token_id, logprob, top, tail))
        digest.update(b"\x00" if named is None else b"\x01" + struct.pack(f">I{len(named)}d", len(named), *named))
    return digest.hexdigest()


def prompt_scoring(params: dict) -> tuple[int, tuple[tuple[int, ...], ...] | None, int] | None:
    """What prompt scoring a receipt's params name: (alternatives per position, the ids named per
    row or None, the first named row's position), or None when the reply scored no prompt
    (a version 1 receipt never did)."""
    if params.get("prompt_logprobs") is None:
        return None
    named = params.get("prompt_logprob_token_ids")
    return (params["prompt_logprobs"], None if named is None else tuple(tuple(row) for row in named),
            params.get("prompt_logprob_start", 0))


@dataclass(frozen=True)
class Outcome:
    """What one run of a receipt's inputs produced (the server's reply, or a re-execution)."""

    token_ids: tuple[int, ...]  # the reply's tokens (those a stop string cut are not in it)
    end_token_id: int | None  # the end-of-turn token that ended it, if one did
    finish_reason: str | None
    num_generated: int  # tokens chosen, those a stop string cut included (the end token not)
    entries: tuple[Entry, ...] | None  # one per token, then the end token's; None: no logprobs asked
    # Re-executed along the receipt's tokens (commands/receipts/replay.py): the receipt's token
    # where the two part was one these settings could draw there; only the seed's draw chose otherwise.
    seed_differs: bool = False
    # Prompt positions 1 on, where the reply scored its prompt; None: not asked, or never scored
    # (aborted before its prefill completed).
    prompt_entries: tuple[PromptEntry, ...] | None = None

    @property
    def logprobs_sha256(self) -> str | None:
        return None if self.entries is None else logprobs_sha256(self.entries)

    @property
    def prompt_logprobs_sha256(self) -> str | None:
        return None if self.prompt_entries is None else prompt_logprobs_sha256(self.prompt_entries)

    def cut(self, num_tokens: int, scored: bool) -> "Outcome":
        """Its first num_tokens tokens, as a reply aborted there shows them (no end token), its
        prompt's entries where the aborted reply had scored its prompt."""
        entries = None if self.entries is None else self.entries[:num_tokens]
        return Outcome(self.token_ids[:num_tokens], None, "abort", num_tokens, entries,
                       prompt_entries=self.prompt_entries if scored else None)


def receipt(model: dict, weight_versions: list[dict], prompt_ids: list[int], params: dict,
            outcome: Outcome) -> dict:
    """One choice's receipt. `model`: sha256, numerics_id, tokenizer_sha256, chat_template_sha256
    (None where no template rendered the prompt); `params`: every setting that decides a bit."""
    return {
        "version": VERSION,
        "model": dict(model),
        "weight_versions": [dict(span) for span in weight_versions],
        "prompt_token_ids": list(prompt_ids),
        "params": params,
        "output_token_ids": list(outcome.token_ids),
        "end_token_id": outcome.end_token_id,
        "finish_reason": outcome.finish_reason,
        "num_generated_tokens": outcome.num_generated,
        "logprobs_sha256": outcome.logprobs_sha256,
        "prompt_logprobs_sha256": outcome.prompt_logprobs_sha256,
        # Each input's own digest: an edited prompt id or seed is named as such, not only as the
        # tokens it no longer reproduces (a digest is no signature: docs/receipts.md says why).
        "checksums": {"prompt_token_ids": checksum(list(prompt_ids)), "params": params_checksum(params)},
    }
