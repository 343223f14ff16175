"""Command-line flags generated from a config dataclass, so each setting is declared once."""

import argparse
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal

# Flags whose name is not the field name with dashes.
FLAG_NAMES: dict[str, str] = {"model_path": "--model", "is_batch_invariant": "--batch-invariant"}


def _base_type(annotation: Any) -> Any:
    """`int | None` -> int; other annotations unchanged."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0]
    return annotation


def flag_name(field_name: str) -> str:
    return FLAG_NAMES.get(field_name, "--" + field_name.replace("_", "-"))


def add_dataclass_arguments(
    parser: argparse.ArgumentParser, cls: type, exclude: frozenset[str] = frozenset()
) -> None:
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.name in exclude:
            continue
        kind = _base_type(hints[field.name])
        help_text = field.metadata.get("help", "")
        if field.default is not None and field.default is not dataclasses.MISSING:
            help_text += f" [default: {field.default}]"
        options: dict[str, Any] = {"dest": field.name, "default": None, "help": help_text}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(kind) is Literal:
            options["choices"] = list(typing.get_args(kind))
        elif kind in (int, float, str, Path):
            options["type"] = kind
            options["metavar"] = field.name.upper().removesuffix("_PATH")
        else:
            raise TypeError(f"{cls.__name__}.{field.name}: no flag for {kind!r}")
        parser.add_argument(flag_name(field.name), **options)


def dataclass_from_args(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """Build `cls` from parsed flags; flags left unset keep the dataclass default."""
    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(cls)
        if getattr(args, f.name, None) is not None
    }
    values.update(overrides)
    return cls(**values)
