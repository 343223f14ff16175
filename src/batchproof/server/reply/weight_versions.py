"""The weight versions a reply carries (docs/weight-versions.md): fields OpenAI's clients ignore,
on each choice (and each streamed chunk's choice), naming the weights that chose its tokens."""

from batchproof.engine.outputs import RequestOutput, VersionSpan


def _spans(spans: list[VersionSpan]) -> list[dict]:
    return [{"start": s.start, "end": s.end, "version": s.version} for s in spans]


def chunk_versions(out: RequestOutput) -> dict:
    """One delta's: the version that chose its last token, and its tokens' spans, indexed over
    the whole reply's tokens (a stream's spans, joined, are the whole reply's)."""
    if not out.weight_version:  # a request refused before it ran: no weights chose anything
        return {}
    return {"weight_version": out.weight_version, "weight_version_spans": _spans(out.weight_version_spans)}


def reply_versions(outputs: list[RequestOutput]) -> dict:
    """A whole choice's: the version that chose its last token (with no token: the one serving
    as it ended), and the spans of its tokens, a version's neighbouring spans joined."""
    last = outputs[-1]
    if not last.weight_version:
        return {}
    joined: list[VersionSpan] = []
    for span in (s for out in outputs for s in out.weight_version_spans):
        if joined and joined[-1].version == span.version and joined[-1].end == span.start:
            joined[-1] = VersionSpan(joined[-1].start, span.end, span.version)
        else:
            joined.append(span)
    return {"weight_version": last.weight_version, "weight_version_spans": _spans(joined)}
