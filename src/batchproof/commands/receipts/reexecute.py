"""Receipts re-executed on a Host and judged: replayed along their own tokens where the host can
(every position's choice checked in one prefill), else those a greedy prefill decides scored
together and the rest generated together; then each is held to the host and to what it produced."""

from typing import Protocol

from batchproof.commands.receipts.scoring import ScoreJob, is_scorable, outcome_from_scores, score_job
from batchproof.notary.receipts.format import Entry, Outcome
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
    return outcomes  # type: ignore[return-value]  # every one is filled


def verify(items: list[Item], host: Host) -> list[Verdict]:
    """One verdict per item, in order (a bad one: BAD_RECEIPT, naming its field)."""
    facts = host.facts()
    good = [item for item in items if item.receipt is not None]
    outcomes = iter(reexecute([item.receipt for item in good], host, facts))
    return [judge(item.receipt, facts, next(outcomes), item.reply) if item.receipt is not None
            else Verdict(Kind.BAD_RECEIPT, item.error.field, None, str(item.error)) for item in items]
