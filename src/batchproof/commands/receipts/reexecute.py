"""Receipts re-executed on a Host and judged: replayed along their own tokens where the host can
(every position's choice checked in one prefill), else those a greedy prefill decides scored
together and the rest generated together; a scored prompt not scored on the way (a server, the
scoring route) is scored on its own; then each is held to the host and to what it produced."""

import dataclasses
from typing import Protocol

from batchproof.commands.receipts.scoring import (
    PromptJob,
    ScoreJob,
    is_scorable,
    outcome_from_scores,
    prompt_job,
    score_job,
)
from batchproof.notary.receipts.format import Entry, Outcome, PromptEntry
from batchproof.notary.receipts.read import Item
from batchproof.notary.receipts.verdict import Kind, Verdict, judge


class Host(Protocol):
    """Where receipts are re-executed: an engine here (local.py) or a server (remote.py)."""

    def facts(self) -> dict:
        """model_sha256, numerics_id, tokenizer_sha256, chat_template_sha256, max_model_len."""

    def replay(self, receipts: list[dict]) -> list[Outcome | str | None]:
        """Each re-executed along its own tokens in one prefill (None: not by this route here)."""

    def score(self, jobs: list[ScoreJob]) -> list[list[Entry] | str]: ...

    def generate(self, jobs: list[tuple[list[int], dict]]) -> list[Outcome | str]: ...

    def score_prompts(self, jobs: list[PromptJob]) -> list[tuple[PromptEntry, ...] | str]:
        """Each prompt's positions 1 on, scored as the job asks."""


def reexecute(receipts: list[dict], host: Host, facts: dict) -> list[Outcome | str]:
    """What each receipt's inputs produce on `host` (a string: why they could not run there)."""
    outcomes: list[Outcome | str | None] = host.replay(receipts)
    left = [outcome is None for outcome in outcomes]
    scored = [i for i, r in enumerate(receipts) if left[i] and is_scorable(r)]
    for i, result in zip(scored, host.score([score_job(receipts[i]) for i in scored])):
        outcomes[i] = result if isinstance(result, str) else outcome_from_scores(receipts[i], result,
                                                                                 facts["max_model_len"])
    generated = [i for i, r in enumerate(receipts) if left[i] and not is_scorable(r)]
    jobs = [(receipts[i]["prompt_token_ids"], receipts[i]["params"]) for i in generated]
    for i, result in zip(generated, host.generate(jobs)):
        outcomes[i] = result
    _score_prompts(receipts, outcomes, host)
    return outcomes  # type: ignore[return-value]  # every one is filled


def _score_prompts(receipts: list[dict], outcomes: list, host: Host) -> None:
    """The scored prompts no route above scored, each on its own (an outcome that could not run keeps its reason)."""
    wanted = [(i, job) for i, r in enumerate(receipts) if (job := prompt_job(r)) is not None
              and isinstance(outcomes[i], Outcome) and outcomes[i].prompt_entries is None]
    for (i, _), scored in zip(wanted, host.score_prompts([job for _, job in wanted])):
        outcomes[i] = scored if isinstance(scored, str) else dataclasses.replace(outcomes[i], prompt_entries=scored)


def verify(items: list[Item], host: Host) -> list[Verdict]:
    """One verdict per item, in order (a bad one: BAD_RECEIPT, naming its field)."""
    facts = host.facts()
    good = [item for item in items if item.receipt is not None]
    outcomes = iter(reexecute([item.receipt for item in good], host, facts))
    return [judge(item.receipt, facts, next(outcomes), item.reply) if item.receipt is not None
            else Verdict(Kind.BAD_RECEIPT, item.error.field, None, str(item.error)) for item in items]
