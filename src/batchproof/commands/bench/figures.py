"""What every bench does with its figures: take medians, turn its dataclasses into the JSON
rows bench/results holds, save them."""

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def as_json(value: Any) -> Any:
    """A figure as plain JSON values, dataclasses as dicts in field order. A field that
    defaults to None is left out while it is None (not measured in this run), so a file keeps
    the keys the runs before the dataclasses wrote; a class with an `as_json` method of its
    own is written by it."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if hasattr(value, "as_json"):
            return value.as_json()
        return {
            f.name: as_json(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not (getattr(value, f.name) is None and f.default is None)
        }
    if isinstance(value, list):
        return [as_json(item) for item in value]
    if isinstance(value, dict):
        return {key: as_json(item) for key, item in value.items()}
    return value


def save(path: Path, figures: Any) -> None:
    path.write_text(json.dumps(as_json(figures), indent=1, default=str) + "\n")
