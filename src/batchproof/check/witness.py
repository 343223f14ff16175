"""Typed reading of a parity witness: ours (v3) and aprender's perf041 v2 and v3."""

# Only the keys the shape check judges are read; every other key (env, notes, slots,
# sampler, aprender's intra_agree_to ...) is ignored. aprender's v2 has no
# top2_margin_at_divergence and no decode_tok_s: they read as null, so a v2 witness is
# judged, never refused, and neither S5's near-tie clause nor S7 can admit it. A band is read
# into the Band the probe writes (common/band.py), its unjudged keys null.

import json
import math

from batchproof.common.band import Band

SHOWN_CHARS = 40  # of a value quoted in a message
IDENTITY_KEYS = ("binary_sha256", "commit", "host", "prompt_sha256")
INTEGER = "an integer"
NUMBER = "a number"
STRING = "a string"
BOOLEAN = "true or false"
# Band key -> the JSON type it must have (or null); the Band's other keys are not judged and read as null.
BAND_KEYS = {
    "result": STRING,
    "m_formed": INTEGER,
    "divergence_at": INTEGER,
    "declared_min": INTEGER,
    "top2_margin_at_divergence": NUMBER,
    "decode_tok_s": NUMBER,
    # Additions to v3 (batchproof): absent in older witnesses and aprender's, so they read as null.
    "divergence_slot": INTEGER,
    "logprob_max_abs_diff": NUMBER,
    "logprobs_bitwise_equal": BOOLEAN,
    "logprobs_attributable": BOOLEAN,  # false: the m=1 reference's own runs differ in logprobs
}
MODEL_KEYS = {"path": STRING, "sha256": STRING}
# A fleet witness's cross-replica agreement (an addition to v3; absent or null elsewhere).
FLEET_KEYS = {"result": STRING, "reason": STRING}
DIVERGENCE_KEYS = {"prompt": INTEGER, "token_index": INTEGER, "kind": STRING}
# Slot key -> type; a slot with a divergence_at is judged against its own m=1 reference.
SLOT_KEYS = {
    "i": INTEGER,
    "divergence_at": INTEGER,
    "top2_margin_at_divergence": NUMBER,
    "logprob_max_abs_diff": NUMBER,
    "logprobs_bitwise_equal": BOOLEAN,
    "logprob_first_diff_at": INTEGER,
    "replica": STRING,  # on a fleet: the replica that served the slot
}


# Additions for any server (issue 27): the reference's logprob stability, the --cache and
# --stream-parity sections and their findings, and the 200s that came back without logprobs.
REFERENCE_KEYS = {"logprobs_stable": BOOLEAN, "logprob_reason": STRING}
SECTION_KEYS = {"result": STRING, "reason": STRING}
FINDING_KEYS = {"kind": STRING, "text": STRING, "attributable": BOOLEAN}
FAIL_OPEN_KEYS = {"route": STRING, "streamed": BOOLEAN, "requests": INTEGER, "what": STRING}
MODE_SECTIONS = ("stream_parity", "cache")


class WitnessError(ValueError):
    """Why a witness cannot be judged (exit 4)."""


def _is_int(value: object) -> bool:
    # bool is an int subclass, and `true` is neither a width nor a margin.
    return isinstance(value, int) and not isinstance(value, bool)


def shown(value: object) -> str:
    """The offending value as JSON, cut short: a message never floods the terminal."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    text = json.dumps(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def typed_value(value: object, kind: str, where: str) -> object:
    """`value` if it is null or of `kind`; a number comes back as a finite float."""
    if value is None:
        return None
    if kind == STRING and isinstance(value, str):
        return value
    if kind == INTEGER and _is_int(value):
        return value
    if kind == BOOLEAN and isinstance(value, bool):
        return value
    if kind == NUMBER and (_is_int(value) or isinstance(value, float)):
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if math.isfinite(number):
            return number
        raise WitnessError(f"{where} is too large a number: {shown(value)}")
    raise WitnessError(f"{where} must be {kind} or null, got {shown(value)}")


def typed_keys(value: object, keys: dict[str, str], where: str) -> dict | None:
    """`keys` of the object `value` (None for null), each of its declared type."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise WitnessError(f"{where or 'the witness'} must be an object or null, got {shown(value)}")
    return {key: typed_value(value.get(key), kind, _child(where, key)) for key, kind in keys.items()}


def _child(where: str, key: str) -> str:
    # A key the witness chose (a replica id) is quoted and cut like any value it supplies.
    name = key if key.isidentifier() and len(key) <= SHOWN_CHARS else shown(key)
    return f"{where}.{name}" if where else name


def _band(index: int, value: object) -> Band:
    where = f"bands[{index}]"
    if not isinstance(value, dict):
        raise WitnessError(f"{where} must be an object, got {shown(value)}")
    c = value.get("c")
    if not _is_int(c) or c < 0:
        raise WitnessError(f"{where}.c must be a non-negative integer, got {shown(c)}")
    typed = {key: typed_value(value.get(key), kind, f"{where}.{key}") for key, kind in BAND_KEYS.items()}
    return Band(
        c=c,
        **typed,
        m_formed_by_replica=_per_replica(value.get("m_formed_by_replica"), f"{where}.m_formed_by_replica"),
        slots=_slots(value.get("slots"), f"{where}.slots"),
        key_order=tuple(value),
    )


def _per_replica(value: object, where: str) -> dict | None:
    """A fleet band's largest batch per replica: replica id -> integer or null."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise WitnessError(f"{where} must be an object or null, got {shown(value)}")
    return {key: typed_value(m, INTEGER, _child(where, key)) for key, m in value.items()}


def _slots(value: object, where: str) -> list[dict]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise WitnessError(f"{where} must be a list or null, got {shown(value)}")
    slots = []
    for index, slot in enumerate(value):
        if not isinstance(slot, dict):
            raise WitnessError(f"{where}[{index}] must be an object, got {shown(slot)}")
        typed = {key: typed_value(slot.get(key), kind, f"{where}[{index}].{key}") for key, kind in SLOT_KEYS.items()}
        if typed["i"] is None:
            typed["i"] = index
        slots.append(typed)
    return slots


def _fleet(value: object) -> dict | None:
    """The fleet section's judged keys: its result and reason, and the first divergence between
    two replicas (the two replica ids, the prompt, the token and what differed)."""
    fleet = typed_keys(value, FLEET_KEYS, "fleet")
    if fleet is None:
        return None
    where = "fleet.divergence"
    raw = value.get("divergence")
    divergence = typed_keys(raw, DIVERGENCE_KEYS, where)
    if divergence is not None:
        replicas = raw.get("replicas")
        if not (isinstance(replicas, list) and len(replicas) == 2 and all(isinstance(r, str) for r in replicas)):
            raise WitnessError(f"{where}.replicas must be a list of two strings, got {shown(replicas)}")
        divergence["replicas"] = replicas
    fleet["divergence"] = divergence
    return fleet


def _bands(value: object, has_finding: bool = False) -> list[Band]:
    """The bands; none is unjudgeable, unless the witness records a fail-open, which is judged
    (NOT ADMISSIBLE) without any band: a server that answers without logprobs has none to show."""
    if value is not None and not isinstance(value, list):
        raise WitnessError(f"bands must be a list or null, got {shown(value)}")
    if not value:
        if has_finding:
            return []
        raise WitnessError("the witness measured no bands")
    return [_band(index, band) for index, band in enumerate(value)]


def _list_of(value: object, keys: dict[str, str], where: str) -> list[dict]:
    """A list (absent or null: empty) of objects with `keys`, each of its declared type."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise WitnessError(f"{where} must be a list or null, got {shown(value)}")
    items = []
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise WitnessError(f"{where}[{index}] must be an object, got {shown(item)}")
        items.append(typed_keys(item, keys, f"{where}[{index}]"))
    return items


def _section(value: object, name: str) -> dict | None:
    """A mode's section: its result and reason, and its findings."""
    section = typed_keys(value, SECTION_KEYS, name)
    if section is not None:
        section["findings"] = _list_of(value.get("findings"), FINDING_KEYS, f"{name}.findings")
    return section


def typed_witness(value: object) -> dict:
    """The judged fields of a parsed witness, each of its declared type."""
    if not isinstance(value, dict):
        raise WitnessError(f"not a JSON object, got {shown(value)}")
    witness = {key: typed_value(value.get(key), STRING, key) for key in IDENTITY_KEYS}
    witness["model"] = typed_keys(value.get("model"), MODEL_KEYS, "model")
    witness["fail_open"] = _list_of(value.get("fail_open"), FAIL_OPEN_KEYS, "fail_open")
    witness["bands"] = _bands(value.get("bands"), bool(witness["fail_open"]))
    witness["fleet"] = _fleet(value.get("fleet"))
    witness["reference_logprobs"] = typed_keys(value.get("reference_logprobs"), REFERENCE_KEYS, "reference_logprobs")
    for name in MODE_SECTIONS:
        witness[name] = _section(value.get(name), name)
    return witness


def parse_witness(text: str) -> dict:
    """The typed witness in `text`; WitnessError for anything that cannot be judged."""
    if not text.strip():
        raise WitnessError("the file is empty")
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise WitnessError("not JSON: nested too deeply") from None
    except ValueError as error:
        # JSONDecodeError, a refused NaN/Infinity, or an integer too long to convert.
        raise WitnessError(f"not JSON: {error}") from None
    return typed_witness(value)
