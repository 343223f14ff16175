"""Whether a request gets receipts, and what a receipt needs before the request runs: a sampled
choice without a seed draws from one the server picks at random and never names, so no receipt
could re-execute it; with a receipt asked for, the server picks that seed here and the receipt
names it (the draws are as random as without a receipt). And every setting must be a JSON
number: a receipt cannot name an infinite repetition_penalty."""

import dataclasses
import math
import secrets

from batchproof.notary.receipts.format import FLOAT_PARAMS
from batchproof.server.errors import APIError
from batchproof.server.request.plan import Plan


def wants_receipts(asked: bool | None, mode: str) -> bool:
    """`receipt: true` on the request, or the server's `--receipts always` (every reply then)."""
    return mode == "always" or asked is True


def seeded(plan: Plan) -> Plan:
    """The plan, each sampled choice without a seed given one (63 random bits, as the engine
    draws); a 400 naming a setting no receipt can write (an infinity: JSON has none)."""
    params = plan.choices[0].params
    for name in FLOAT_PARAMS:
        values = params.logit_bias.values() if name == "logit_bias" else [getattr(params, name)]
        if not all(math.isfinite(v) for v in values):
            raise APIError(400, f"'{name}' is not finite: a receipt names every setting as a JSON number, and JSON "
                                "has no infinities", param=name)
    choices = [dataclasses.replace(c, params=dataclasses.replace(c.params, seed=secrets.randbits(63)))
               if c.params.seed is None and not c.params.is_greedy else c for c in plan.choices]
    return dataclasses.replace(plan, choices=choices)
