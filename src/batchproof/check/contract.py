"""The serving-shape parity contract: its dataclass and its strict YAML loading."""

import math
import reprlib
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
_OPTIONAL_KEYS = ("require_bitwise_logprobs", "require_stable_reference")
_MODEL_KEYS = ("prefix", "sha256")
# A value quoted in a message is cut to a few items and characters: a contract's error is one
# short line however large (or deeply nested) the value that caused it.
_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 80  # a sha256's 64 hex digits still show whole
_SHOWN.maxlevel, _SHOWN.maxlong = 2, 40
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 6


class ContractError(ValueError):
    """A contract that cannot be used, naming the key at fault."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem

    def under(self, parent: str) -> "ContractError":
        return ContractError(f"{parent}.{self.key}", self.problem)


def _shown(value: object) -> str:
    return _SHOWN.repr(value)


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
            raise ContractError("prefix", f"must be a non-empty string, got {_shown(self.prefix)}")
        if self.sha256 is not None and not _is_sha256(self.sha256):
            raise ContractError("sha256", f"must be 64 hex digits, got {_shown(self.sha256)}")


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
    # The m=1 reference's own runs must agree on every logprob: otherwise no band's logprob
    # difference can be blamed on (or cleared of) batching.
    require_stable_reference: bool = False

    def __post_init__(self) -> None:
        models = self.blessed_models
        if not isinstance(models, tuple) or not models:
            raise ContractError("blessed_models", f"must list at least one model, got {_shown(models)}")
        if not all(isinstance(model, BlessedModel) for model in models):
            raise ContractError("blessed_models", "must hold BlessedModel entries")
        bands = self.bands
        if not isinstance(bands, tuple) or not bands or not all(_is_int(c) and c >= 1 for c in bands):
            raise ContractError("bands", f"must list positive integers, got {_shown(bands)}")
        if len(set(bands)) != len(bands):
            raise ContractError("bands", f"lists a band twice: {_shown(bands)}")
        _require_number("near_tie_eps", self.near_tie_eps)
        _require_count("near_tie_cap", self.near_tie_cap)
        _require_count("declared_min_floor", self.declared_min_floor)
        _require_number("decode_ratio_c4_over_c1", self.decode_ratio_c4_over_c1)
        for key in _OPTIONAL_KEYS:
            if not isinstance(getattr(self, key), bool):
                raise ContractError(key, f"must be true or false, got {_shown(getattr(self, key))}")


def _require_number(key: str, value: object) -> None:
    if not _is_number(value) or value < 0:
        raise ContractError(key, f"must be a finite number >= 0, got {_shown(value)}")


def _require_count(key: str, value: object) -> None:
    if not _is_int(value) or value < 0:
        raise ContractError(key, f"must be an integer >= 0, got {_shown(value)}")


def _fields(raw: object, where: str, required: tuple[str, ...], known: tuple[str, ...]) -> dict:
    """The mapping `raw`, refusing a missing or an unknown key by name."""
    if not isinstance(raw, dict):
        raise ContractError(where or DOCUMENT, f"must be a mapping, got {_shown(raw)}")
    unknown = [key for key in raw if key not in known]
    if unknown:
        raise ContractError(_child(where, unknown[0]), "is not a contract key")
    missing = [key for key in required if key not in raw]
    if missing:
        raise ContractError(_child(where, missing[0]), "is missing")
    return raw


def _child(where: str, key: object) -> str:
    # A key is the file's to choose: anything but a short plain name is quoted and cut.
    name = key if isinstance(key, str) and key.isidentifier() and len(key) <= _SHOWN.maxstring else _shown(key)
    return f"{where}.{name}" if where else name


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
        require_stable_reference=fields.get("require_stable_reference", False),
    )


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases (`*name`). A contract is a few hand-written keys and
    needs none, while nested aliases ("billion laughs") make a few lines stand for billions of
    values: cheap to load as shared objects, but not to check, quote or copy."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            line = self.peek_event().start_mark.line + 1
            raise ContractError(DOCUMENT, f"uses a YAML alias on line {line}; a contract must spell out its values")
        return super().compose_node(parent, index)


def contract_from_text(text: str) -> Contract:
    try:
        raw = yaml.load(text, Loader=_NoAliasLoader)  # a SafeLoader: plain data, never Python objects
    except yaml.YAMLError as error:
        raise ContractError(DOCUMENT, f"is not YAML ({_yaml_problem(error)})") from None
    return contract_from_mapping(raw)


def _yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's complaint on one line: where, and what (its own text runs over several, quoting the file)."""
    mark, problem = getattr(error, "problem_mark", None), getattr(error, "problem", None)
    if mark is None or problem is None:
        return _shown(str(error))
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"


def shipped_contract_text(name: str = SHIPPED) -> str:
    return resources.files("batchproof.check").joinpath(name).read_bytes().decode("utf-8")


def load_contract(path: Path | None = None) -> Contract:
    """The contract at `path`, or the shipped one; OSError and UnicodeDecodeError are the caller's."""
    # Bytes decoded as UTF-8, never the locale's encoding: a contract reads the same everywhere.
    text = shipped_contract_text() if path is None else path.read_bytes().decode("utf-8")
    return contract_from_text(text)
