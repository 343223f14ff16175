"""Typed reading of a parity witness: ours (v3) and aprender's perf041 v2 and v3."""

# Only the keys the shape check judges are read; every other key (env, notes, slots,
# sampler, aprender's intra_agree_to ...) is ignored. aprender's v2 has no
# top2_margin_at_divergence and no decode_tok_s: they read as null, so a v2 witness is
# judged, never refused, and neither S5's near-tie clause nor S7 can admit it.

import json
import math

IDENTITY_KEYS = ("binary_sha256", "commit", "host", "prompt_sha256")
_INTEGER = "an integer"
_NUMBER = "a number"
_STRING = "a string"
_BOOLEAN = "true or false"
# Band key -> the JSON type it must have (or null).
BAND_KEYS = {
    "result": _STRING,
    "m_formed": _INTEGER,
    "divergence_at": _INTEGER,
    "declared_min": _INTEGER,
    "top2_margin_at_divergence": _NUMBER,
    "decode_tok_s": _NUMBER,
    # Additions to v3 (batchproof): absent in older witnesses and aprender's, so they read as null.
    "divergence_slot": _INTEGER,
    "logprob_max_abs_diff": _NUMBER,
    "logprobs_bitwise_equal": _BOOLEAN,
}
# A fleet witness's cross-replica agreement (an addition to v3; absent or null elsewhere).
FLEET_KEYS = {"result": _STRING, "reason": _STRING}
DIVERGENCE_KEYS = {"prompt": _INTEGER, "token_index": _INTEGER, "kind": _STRING}
# Slot key -> type; a slot with a divergence_at is judged against its own m=1 reference.
SLOT_KEYS = {
    "i": _INTEGER,
    "divergence_at": _INTEGER,
    "top2_margin_at_divergence": _NUMBER,
    "logprob_max_abs_diff": _NUMBER,
    "logprobs_bitwise_equal": _BOOLEAN,
    "logprob_first_diff_at": _INTEGER,
    "replica": _STRING,  # on a fleet: the replica that served the slot
}


class WitnessError(ValueError):
    """Why a witness cannot be judged (exit 4)."""


def _is_int(value: object) -> bool:
    # bool is an int subclass, and `true` is neither a width nor a margin.
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: object) -> str:
    """The offending value as JSON, cut short: a message never floods the terminal."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _typed(value: object, kind: str, where: str) -> object:
    """`value` if it is null or of `kind`; a number comes back as a finite float."""
    if value is None:
        return None
    if kind == _STRING and isinstance(value, str):
        return value
    if kind == _INTEGER and _is_int(value):
        return value
    if kind == _BOOLEAN and isinstance(value, bool):
        return value
    if kind == _NUMBER and (_is_int(value) or isinstance(value, float)):
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if math.isfinite(number):
            return number
        raise WitnessError(f"{where} is too large a number: {_show(value)}")
    raise WitnessError(f"{where} must be {kind} or null, got {_show(value)}")


def _model(value: object) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise WitnessError(f"model must be an object or null, got {_show(value)}")
    return {key: _typed(value.get(key), _STRING, f"model.{key}") for key in ("path", "sha256")}


def _band(index: int, value: object) -> dict:
    where = f"bands[{index}]"
    if not isinstance(value, dict):
        raise WitnessError(f"{where} must be an object, got {_show(value)}")
    c = value.get("c")
    if not _is_int(c) or c < 0:
        raise WitnessError(f"{where}.c must be a non-negative integer, got {_show(c)}")
    band = {"c": c}
    for key, kind in BAND_KEYS.items():
        band[key] = _typed(value.get(key), kind, f"{where}.{key}")
    band["m_formed_by_replica"] = _per_replica(value.get("m_formed_by_replica"), f"{where}.m_formed_by_replica")
    band["slots"] = _slots(value.get("slots"), f"{where}.slots")
    return band


def _per_replica(value: object, where: str) -> dict | None:
    """A fleet band's largest batch per replica: replica id -> integer or null."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise WitnessError(f"{where} must be an object or null, got {_show(value)}")
    return {key: _typed(m, _INTEGER, f"{where}.{key}") for key, m in value.items()}


def _slots(value: object, where: str) -> list[dict]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise WitnessError(f"{where} must be a list or null, got {_show(value)}")
    slots = []
    for index, slot in enumerate(value):
        if not isinstance(slot, dict):
            raise WitnessError(f"{where}[{index}] must be an object, got {_show(slot)}")
        typed = {key: _typed(slot.get(key), kind, f"{where}[{index}].{key}") for key, kind in SLOT_KEYS.items()}
        if typed["i"] is None:
            typed["i"] = index
        slots.append(typed)
    return slots


def _fleet(value: object) -> dict | None:
    """The fleet section's judged keys: its result and reason, and the first divergence between
    two replicas (the two replica ids, the prompt, the token and what differed)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise WitnessError(f"fleet must be an object or null, got {_show(value)}")
    fleet = {key: _typed(value.get(key), kind, f"fleet.{key}") for key, kind in FLEET_KEYS.items()}
    raw = value.get("divergence")
    if raw is not None and not isinstance(raw, dict):
        raise WitnessError(f"fleet.divergence must be an object or null, got {_show(raw)}")
    divergence = None
    if raw is not None:
        where = "fleet.divergence"
        divergence = {key: _typed(raw.get(key), kind, f"{where}.{key}") for key, kind in DIVERGENCE_KEYS.items()}
        replicas = raw.get("replicas")
        if not (isinstance(replicas, list) and len(replicas) == 2 and all(isinstance(r, str) for r in replicas)):
            raise WitnessError(f"{where}.replicas must be a list of two strings, got {_show(replicas)}")
        divergence["replicas"] = replicas
    fleet["divergence"] = divergence
    return fleet


def _bands(value: object) -> list[dict]:
    if value is not None and not isinstance(value, list):
        raise WitnessError(f"bands must be a list or null, got {_show(value)}")
    if not value:
        raise WitnessError("the witness measured no bands")
    return [_band(index, band) for index, band in enumerate(value)]


def typed_witness(value: object) -> dict:
    """The judged fields of a parsed witness, each of its declared type."""
    if not isinstance(value, dict):
        raise WitnessError(f"not a JSON object, got {_show(value)}")
    witness = {key: _typed(value.get(key), _STRING, key) for key in IDENTITY_KEYS}
    witness["model"] = _model(value.get("model"))
    witness["bands"] = _bands(value.get("bands"))
    witness["fleet"] = _fleet(value.get("fleet"))
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
