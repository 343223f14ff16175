"""The probe's policy: perf-matrix.yaml read strictly, with no silent defaults."""

import dataclasses
import reprlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

SHIPPED = "perf-matrix.yaml"
# The matrix is a dozen keys three deep: anything past these is not a matrix, and is refused
# before it is read whole (a huge file) or composed (deep nesting overflows the Python stack).
MAX_MATRIX_BYTES = 64 * 2**10
MAX_DEPTH = 16
SHOWN_CHARS = 60  # of a string quoted in a message

# Every key the matrix must have, and nothing else: a typo is refused, never ignored.
SCHEMA: dict[str, Any] = {
    "protocol": {
        "n_predict": None,
        "sampler": {"temperature": None, "seed": None, "ignore_eos": None},
    },
    "ladder": {"declared": None},
    "witness": {"min_agree_tokens": None, "max_constant_run": None},
}


class MatrixError(ValueError):
    """The matrix cannot configure a run; the message names the key."""


def _shown(value: Any) -> str:
    """A value as a message quotes it, cut short (reprlib's limits on lists, depth and strings):
    the message names the key, it need not echo the file."""
    cut = reprlib.Repr()
    cut.maxstring = cut.maxother = SHOWN_CHARS
    return cut.repr(value)


class _PlainLoader(yaml.SafeLoader):
    """SafeLoader without anchors and aliases, nested at most MAX_DEPTH: the matrix needs neither,
    and aliases nested in aliases ("billion laughs") grow exponentially once anything walks them."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(None, None, "anchors and aliases (& and *) are not allowed",
                                              event.start_mark)
        if self._depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH}", event.start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


@dataclass(frozen=True)
class Matrix:
    n_predict: int
    temperature: float
    seed: int
    ignore_eos: bool
    ladder: tuple[int, ...]
    min_agree_tokens: int
    max_constant_run: int
    source: str = SHIPPED
    ladder_key: str = "ladder.declared"

    def __post_init__(self) -> None:
        self._need_int("protocol.n_predict", self.n_predict, minimum=1)
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 <= t <= 2:
            self._refuse("protocol.sampler.temperature", f"must be a number in 0..2, got {_shown(t)}")
        self._need_int("protocol.sampler.seed", self.seed, minimum=0)
        if not isinstance(self.ignore_eos, bool):
            self._refuse("protocol.sampler.ignore_eos", f"must be true or false, got {_shown(self.ignore_eos)}")
        if not isinstance(self.ladder, tuple) or not self.ladder:
            ladder = _shown(list(self.ladder or ()))
            self._refuse(self.ladder_key, f"must be a non-empty list of concurrencies, got {ladder}")
        for c in self.ladder:
            self._need_int(self.ladder_key, c, minimum=1)
        self._need_int("witness.min_agree_tokens", self.min_agree_tokens, minimum=1)
        if self.min_agree_tokens > self.n_predict:
            self._refuse(
                "witness.min_agree_tokens",
                f"{self.min_agree_tokens} is above protocol.n_predict {self.n_predict}: "
                "no request could ever agree that far",
            )
        self._need_int("witness.max_constant_run", self.max_constant_run, minimum=1)

    def _refuse(self, key: str, why: str) -> None:
        raise MatrixError(f"matrix {self.source}: {key} {why}")

    def _need_int(self, key: str, value: Any, minimum: int) -> None:
        # bool is an int subclass, but `true` is never a count.
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self._refuse(key, f"must be an integer >= {minimum}, got {_shown(value)}")

    def with_ladder(self, ladder: list[int]) -> "Matrix":
        """The same policy with `--ladder` in place of the declared ladder."""
        return dataclasses.replace(self, ladder=tuple(ladder), ladder_key="--ladder")


def load_matrix(path: Path | None = None) -> Matrix:
    """The matrix at `path`, or the one shipped in the package."""
    if path is None:
        source = SHIPPED
        text = resources.files("batchproof.probe").joinpath(SHIPPED).read_text(encoding="utf-8")
    else:
        source = str(path)
        if not path.is_file():
            raise MatrixError(f"matrix {source}: not a file")
        try:
            with path.open("rb") as file:
                data = file.read(MAX_MATRIX_BYTES + 1)
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise MatrixError(f"matrix {source}: cannot be read ({err})") from None
        if len(data) > MAX_MATRIX_BYTES:
            raise MatrixError(f"matrix {source}: larger than {MAX_MATRIX_BYTES // 2**10} KiB; a matrix is a few lines")
    return parse_matrix(text, source)


def parse_matrix(text: str, source: str = SHIPPED) -> Matrix:
    """Parse and validate the matrix's YAML text."""
    try:
        doc = yaml.load(text, Loader=_PlainLoader)  # a SafeLoader, stricter
    except yaml.YAMLError as err:
        raise MatrixError(f"matrix {source}: not valid YAML ({err})") from None
    _check_shape(doc, SCHEMA, "", source)
    protocol, sampler = doc["protocol"], doc["protocol"]["sampler"]
    ladder = doc["ladder"]["declared"]
    if not isinstance(ladder, list):
        raise MatrixError(f"matrix {source}: ladder.declared must be a list, got {_shown(ladder)}")
    return Matrix(
        n_predict=protocol["n_predict"],
        temperature=sampler["temperature"],
        seed=sampler["seed"],
        ignore_eos=sampler["ignore_eos"],
        ladder=tuple(ladder),
        min_agree_tokens=doc["witness"]["min_agree_tokens"],
        max_constant_run=doc["witness"]["max_constant_run"],
        source=source,
    )


def _check_shape(node: Any, schema: dict[str, Any], prefix: str, source: str) -> None:
    where = prefix.rstrip(".") or "the top level"
    if not isinstance(node, dict):
        raise MatrixError(f"matrix {source}: {where} must be a mapping, got {_shown(node)}")
    for key, sub in schema.items():
        if key not in node:
            raise MatrixError(f"matrix {source}: missing key {prefix}{key}")
        if sub is not None:
            _check_shape(node[key], sub, f"{prefix}{key}.", source)
    unknown = sorted(str(k) for k in node if k not in schema)
    if unknown:
        raise MatrixError(f"matrix {source}: unknown key {prefix}{unknown[0]}")
