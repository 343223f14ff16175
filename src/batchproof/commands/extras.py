"""Which packages of one of our extras this install lacks, read from batchproof's own installed
metadata: `pip install batchproof` is the probe, the check and the report alone (no torch), and a
verb that needs the server's packages says which extra to install instead of failing on an import."""

import re
from collections.abc import Callable
from importlib import metadata

# `name[extras] version; marker`, as pip writes a Requires-Dist line (PEP 508); only the name,
# the extras and the marker matter here.
_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?[^;]*(?:;(.*))?")
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
SELF = "batchproof"


def is_installed(distribution: str) -> bool:
    try:
        metadata.distribution(distribution)  # names are matched normalized: prometheus-client, PyYAML
    except metadata.PackageNotFoundError:
        return False
    return True


def missing_from(requirements: list[str], extra: str, installed: Callable[[str], bool]) -> list[str]:
    """The distributions that `extra` adds to `requirements` (our Requires-Dist lines) and that are
    not `installed`, the extra's own first; an extra that names our own package with extras
    (`batchproof[serve]`, as `fleet` does) brings those extras' requirements too."""
    missing: list[str] = []
    todo, seen = [extra], set()
    while todo:
        wanted = todo.pop(0)
        seen.add(wanted)
        for line in requirements:
            name, extras, marker = _REQUIREMENT.match(line).groups()
            if wanted not in _EXTRA_MARKER.findall(marker or ""):
                continue
            if name.lower() == SELF:
                todo += [e.strip() for e in (extras or "").split(",") if e.strip() and e.strip() not in seen]
            elif not installed(name) and name not in missing:
                missing.append(name)
    return missing


def missing(extra: str) -> list[str]:
    """What this install lacks of `batchproof[extra]`; nothing when batchproof is not installed
    (run from a source tree on PYTHONPATH there is no metadata to go by, and an import says the rest)."""
    try:
        requirements = metadata.requires(SELF) or []
    except metadata.PackageNotFoundError:
        return []
    return missing_from(requirements, extra, is_installed)


def install_hint(verb: str, extra: str, absent: list[str]) -> str:
    """The one line a verb prints, instead of a traceback, when its extra is not installed."""
    shown = ", ".join(absent[:4]) + (f" and {len(absent) - 4} more" if len(absent) > 4 else "")
    return (f"batchproof {verb}: needs the '{extra}' extra, which this install lacks ({shown} not installed): "
            f"pip install 'batchproof[{extra}]' (from a checkout: pip install -e '.[{extra}]')")
