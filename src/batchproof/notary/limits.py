"""How much one request of rollouts may hold, counted on its decoded JSON before any record is
checked or any list validated: a body of megabytes spells millions of numbers, and checking them
holds the GIL (the issue's 3,000,000 TIS caps kept /health silent 2.4 s and built a 149 MiB
report). Counting is a len() a list, stopped at the first limit passed."""

from dataclasses import dataclass

from batchproof.notary.records import FIELDS

# The report's worst case, in the entries --max-logprob-entries counts (a reply's logprob
# entry, ~50 bytes: 100,000 bound a reply near 5 MB). A completion token can put ~250 bytes in
# the report (its |delta|, a near tie, a disagreement and a by-position row, measured at
# 245 bytes with every float at 17 digits: tests/notary/test_limits.py holds the bound).
ENTRIES_PER_TOKEN = 6
ENTRIES_PER_ROLLOUT = 30  # its own row, ~530 bytes, and its id quoted back (MAX_ID_CHARS, escaped)
BYTES_PER_ENTRY = 50
MAX_ID_CHARS = 128
MAX_TIS_CAPS = 64  # a report's table row each; verl and TRL each take one cap


@dataclass(frozen=True)
class Bounds:
    max_rollouts: int  # sequences one request may queue (--max-queue)
    max_tokens: int  # a rollout's prompt and completion: the model's context
    max_alternatives: int  # per top_logprobs row: --max-logprobs and the sampled token itself
    max_entries: int  # --max-logprob-entries: the report's worst case and the claimed alternatives


class TooLarge(ValueError):
    """A list past its limit; `field` names it as the API spells it (`rollouts[3].logprobs`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _len(value: object) -> int:
    return len(value) if isinstance(value, list | dict) else 0  # any other type: the record check names it


def check_sizes(body: dict, bounds: Bounds) -> None:
    """TooLarge naming the first list of `body` (the request, decoded) past its limit."""
    caps, band = body.get("tis_caps"), body.get("mask_band")
    if isinstance(caps, list) and len(caps) > MAX_TIS_CAPS:
        raise TooLarge("tis_caps", f"'tis_caps' holds {len(caps)} numbers; at most {MAX_TIS_CAPS} caps are taken")
    if isinstance(band, list) and len(band) != 2:
        raise TooLarge("mask_band", f"'mask_band' holds {len(band)} numbers; a band is two, [low, high]")
    rollouts = body.get("rollouts")
    if not isinstance(rollouts, list):
        return
    if len(rollouts) > bounds.max_rollouts:
        raise TooLarge("rollouts", f"'rollouts' holds {len(rollouts)}; this server queues at most "
                                   f"{bounds.max_rollouts} sequences a request (--max-queue)")
    entries = 0
    for i, record in enumerate(rollouts):
        if isinstance(record, dict):
            entries += _record_entries(record, f"rollouts[{i}]", bounds)
        if entries > bounds.max_entries:
            raise TooLarge("rollouts", f"by rollouts[{i}] the report could hold {entries} entries "
                                       f"({ENTRIES_PER_TOKEN} a completion token, {ENTRIES_PER_ROLLOUT} a rollout, "
                                       f"1 a claimed alternative), past this server's {bounds.max_entries} "
                                       "(--max-logprob-entries): send fewer rollouts a request")


def _record_entries(record: dict, where: str, bounds: Bounds) -> int:
    """One record's lists checked against the context -> its entries."""
    if len(record) > len(FIELDS):  # keys are unique: one at least is unknown
        raise TooLarge(where, f"{where} holds {len(record)} fields; a rollout has at most {len(FIELDS)} "
                              f"({', '.join(FIELDS)})")
    num_tokens = _len(record.get("prompt_token_ids")) + _len(record.get("completion_token_ids"))
    if num_tokens > bounds.max_tokens:
        raise TooLarge(f"{where}.completion_token_ids", f"{where}: prompt and completion hold {num_tokens} tokens; "
                                                        f"this model's context holds {bounds.max_tokens}")
    for name in ("logprobs", "top_logprobs", "routed_experts"):
        if _len(record.get(name)) > bounds.max_tokens:
            raise TooLarge(f"{where}.{name}", f"{where}: '{name}' holds {_len(record.get(name))} values; a rollout "
                                              f"holds at most {bounds.max_tokens} tokens (this model's context)")
    rollout_id = record.get("id")
    if isinstance(rollout_id, str) and len(rollout_id) > MAX_ID_CHARS:
        raise TooLarge(f"{where}.id", f"{where}: 'id' holds {len(rollout_id)} characters; at most {MAX_ID_CHARS}")
    num_alternatives = 0
    rows = record.get("top_logprobs")
    for j, row in enumerate(rows if isinstance(rows, list) else ()):
        if _len(row) > bounds.max_alternatives:
            raise TooLarge(f"{where}.top_logprobs", f"{where}: 'top_logprobs[{j}]' holds {_len(row)} alternatives; "
                                                    f"at most {bounds.max_alternatives} are taken (--max-logprobs, "
                                                    "and the token itself)")
        num_alternatives += _len(row)
    return ENTRIES_PER_ROLLOUT + ENTRIES_PER_TOKEN * _len(record.get("completion_token_ids")) + num_alternatives
