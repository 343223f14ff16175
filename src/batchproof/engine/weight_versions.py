"""Which weights chose each token: a label per installed model, kept on each sequence as the
output index where each version began, and stamped on every delta as spans over the reply."""

from batchproof.engine.outputs import RequestOutput, VersionSpan
from batchproof.engine.sequence import Sequence

# A version defaults to the first 16 hex digits of the served bytes' sha256 (64 bits: two
# checkpoints of one run do not collide; /weight_info gives the whole hash beside it).
DEFAULT_VERSION_DIGITS = 16


def default_version(sha256: str) -> str:
    return sha256[:DEFAULT_VERSION_DIGITS]


def spans(marks: list[tuple[int, str]], start: int, end: int) -> list[VersionSpan]:
    """The versions of output tokens start..end-1, from a sequence's marks (each version's
    first output index, in order); empty spans (a version that chose nothing) are left out."""
    found = []
    for i, (begin, version) in enumerate(marks):
        stop = marks[i + 1][0] if i + 1 < len(marks) else end
        lo, hi = max(begin, start), min(stop, end)
        if lo < hi:
            found.append(VersionSpan(lo, hi, version))
    return found


def label(out: RequestOutput, seq: Sequence) -> None:
    """Stamp a delta with the versions of the tokens it releases (they may have been chosen a
    few steps before: a stop string holds text back)."""
    start = seq.num_released
    # The end-of-turn token that ended the reply is counted too: it was chosen like any token.
    seq.num_released += len(out.token_ids) + (out.end_token_id is not None)
    out.weight_version_spans = spans(seq.weight_versions, start, seq.num_released)
    out.weight_version = (out.weight_version_spans[-1].version if out.weight_version_spans
                          else seq.weight_versions[-1][1])


def first_mark(version: str) -> list[tuple[int, str]]:
    """A new sequence's marks: every output token so far (none) chosen by `version`."""
    return [(0, version)]


def mark_version(seq: Sequence, version: str) -> None:
    """From its next output token on, `version` chooses (a keep swap): a reply so far keeps
    its marks; one with no output yet is all the new version's."""
    if seq.output_ids:
        seq.weight_versions.append((len(seq.output_ids), version))
    else:
        seq.weight_versions = first_mark(version)
