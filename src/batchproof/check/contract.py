"""The serving-shape parity contract: its dataclass and its strict YAML loading."""

import math
import string
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

SHIPPED = "contracts/serving-shape-parity.yaml"
# Packaged models (`--model NAME`) judged by a contract of their own, beside the default one.
SHIPPED_FOR_MODEL = {"gemma3-270m": "contracts/gemma3-270m.yaml"}
DOCUMENT = "(the document)"
_KEYS = (
    "blessed_models",
    "bands",
    "near_tie_eps",
    "near_tie_cap",
    "declared_min_floor",
    "decode_ratio_c4_over_c1",
)
# Optional clauses: absent means off, so contracts written before them (aprender's) still load.
_OPTIONAL_KEYS = ("require_bitwise_logprobs",)
_MODEL_KEYS = ("prefix", "sha256")


class ContractError(ValueError):
    """A contract that cannot be used, naming the key at fault."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem

    def under(self, parent: str) -> "ContractError":
        return ContractError(f"{parent}.{self.key}", self.problem)


def _is_int(value: object) -> bool:
    # bool is an int subclass, and `true` is not a count.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _is_sha256(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= set(string.hexdigits)


@dataclass(frozen=True)
class BlessedModel:
    """One blessed model: a file-name prefix and, optionally, the file's sha256."""

    prefix: str
    sha256: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not self.prefix.strip():
            raise ContractError("prefix", f"must be a non-empty string, got {self.prefix!r}")
        if self.sha256 is not None and not _is_sha256(self.sha256):
            raise ContractError("sha256", f"must be 64 hex digits, got {self.sha256!r}")


@dataclass(frozen=True)
class Contract:
    """What a witness must show to be admissible under the serving-shape parity rules."""

    blessed_models: tuple[BlessedModel, ...]
    bands: tuple[int, ...]
    near_tie_eps: float
    near_tie_cap: int
    declared_min_floor: int
    decode_ratio_c4_over_c1: float
    require_bitwise_logprobs: bool = False

    def __post_init__(self) -> None:
        models = self.blessed_models
        if not isinstance(models, tuple) or not models:
            raise ContractError("blessed_models", f"must list at least one model, got {models!r}")
        if not all(isinstance(model, BlessedModel) for model in models):
            raise ContractError("blessed_models", "must hold BlessedModel entries")
        bands = self.bands
        if not isinstance(bands, tuple) or not bands or not all(_is_int(c) and c >= 1 for c in bands):
            raise ContractError("bands", f"must list positive integers, got {bands!r}")
        if len(set(bands)) != len(bands):
            raise ContractError("bands", f"lists a band twice: {bands!r}")
        _require_number("near_tie_eps", self.near_tie_eps)
        _require_count("near_tie_cap", self.near_tie_cap)
        _require_count("declared_min_floor", self.declared_min_floor)
        _require_number("decode_ratio_c4_over_c1", self.decode_ratio_c4_over_c1)
        if not isinstance(self.require_bitwise_logprobs, bool):
            raise ContractError(
                "require_bitwise_logprobs", f"must be true or false, got {self.require_bitwise_logprobs!r}"
            )


def _require_number(key: str, value: object) -> None:
    if not _is_number(value) or value < 0:
        raise ContractError(key, f"must be a finite number >= 0, got {value!r}")


def _require_count(key: str, value: object) -> None:
    if not _is_int(value) or value < 0:
        raise ContractError(key, f"must be an integer >= 0, got {value!r}")


def _fields(raw: object, where: str, required: tuple[str, ...], known: tuple[str, ...]) -> dict:
    """The mapping `raw`, refusing a missing or an unknown key by name."""
    if not isinstance(raw, dict):
        raise ContractError(where or DOCUMENT, f"must be a mapping, got {raw!r}")
    unknown = [key for key in raw if key not in known]
    if unknown:
        raise ContractError(_child(where, unknown[0]), "is not a contract key")
    missing = [key for key in required if key not in raw]
    if missing:
        raise ContractError(_child(where, missing[0]), "is missing")
    return raw


def _child(where: str, key: object) -> str:
    return f"{where}.{key}" if where else str(key)


def _as_tuple(value: object) -> object:
    # A YAML list becomes a tuple; anything else is left for __post_init__ to refuse.
    return tuple(value) if isinstance(value, list) else value


def _blessed_models(raw: object) -> object:
    if not isinstance(raw, list):
        return raw
    models = []
    for index, entry in enumerate(raw):
        where = f"blessed_models[{index}]"
        fields = _fields(entry, where, ("prefix",), _MODEL_KEYS)
        try:
            models.append(BlessedModel(fields["prefix"], fields.get("sha256")))
        except ContractError as error:
            raise error.under(where) from None
    return tuple(models)


def contract_from_mapping(raw: object) -> Contract:
    """A Contract from parsed YAML, refusing anything not exactly the contract's shape."""
    fields = _fields(raw, "", _KEYS, _KEYS + _OPTIONAL_KEYS)
    return Contract(
        blessed_models=_blessed_models(fields["blessed_models"]),
        bands=_as_tuple(fields["bands"]),
        near_tie_eps=fields["near_tie_eps"],
        near_tie_cap=fields["near_tie_cap"],
        declared_min_floor=fields["declared_min_floor"],
        decode_ratio_c4_over_c1=fields["decode_ratio_c4_over_c1"],
        require_bitwise_logprobs=fields.get("require_bitwise_logprobs", False),
    )


def contract_from_text(text: str) -> Contract:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ContractError(DOCUMENT, f"is not YAML ({error})") from None
    return contract_from_mapping(raw)


def shipped_contract_text(name: str = SHIPPED) -> str:
    return resources.files("batchproof.check").joinpath(name).read_bytes().decode("utf-8")


def load_contract(path: Path | None = None) -> Contract:
    """The contract at `path`, or the shipped one; OSError and UnicodeDecodeError are the caller's."""
    # Bytes decoded as UTF-8, never the locale's encoding: a contract reads the same everywhere.
    text = shipped_contract_text() if path is None else path.read_bytes().decode("utf-8")
    return contract_from_text(text)
