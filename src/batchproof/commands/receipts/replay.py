"""The prefill route for every receipt, sampled ones included: the reply's tokens are known, so
the engine re-executes prompt + reply in one prefill and checks each position's choice
(engine/replay.py); here a receipt becomes its known reply, and what came back its outcome.

Not replayed (generated again instead): a reply a stop string cut (the cut tokens are in no
receipt, so their rows cannot be fed), and any receipt on an engine whose rows depend on how the
tokens were fed (the torch path)."""

import dataclasses

from batchproof.engine.engine import Engine
from batchproof.engine.replay import Known, Replayed
from batchproof.engine.replay import replay as replay_known
from batchproof.notary.receipts.format import Outcome
from batchproof.server.reply.receipt import outcome_of, sampling_params


def is_replayable(receipt: dict) -> bool:
    """Every token the reply chose is named (none cut by a stop string), and at least one was chosen."""
    num_rows = len(receipt["output_token_ids"]) + (receipt["end_token_id"] is not None)
    return receipt["num_generated_tokens"] == len(receipt["output_token_ids"]) and num_rows > 0


def replay(engine: Engine, receipts: list[dict]) -> list[Outcome | str]:
    """What each receipt's inputs produce on `engine` (idle; is_replayable ones): the outcome ends
    at the first position whose choice differs (that choice included), or a string saying why it
    could not run."""
    replayed = replay_known(engine, [_known(receipt) for receipt in receipts])
    return [r if isinstance(r, str) else _outcome(r, receipt) for r, receipt in zip(replayed, receipts)]


def _known(receipt: dict) -> Known:
    params = dataclasses.replace(sampling_params(receipt["params"]), cache_namespace=None)
    end = receipt["end_token_id"]
    wanted = [*receipt["output_token_ids"], *([end] if end is not None else [])]
    return Known(receipt["prompt_token_ids"], params, wanted)


def _outcome(replayed: Replayed, receipt: dict) -> Outcome | str:
    last = replayed.outputs[-1]
    if last.finish_reason == "error":
        return f"generation failed: {last.error}"
    outcome = outcome_of(replayed.outputs, receipt["params"].get("top_logprobs") is not None)
    if receipt["finish_reason"] != "abort" and outcome.finish_reason == "abort":
        # It would have gone on past the receipt's last token: not an ending re-execution chose.
        outcome = dataclasses.replace(outcome, finish_reason=None)
    return dataclasses.replace(outcome, seed_differs=True) if replayed.seed_differs else outcome
