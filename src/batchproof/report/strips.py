"""One strip per slot: where its tokens agreed with the m=1 reference, where its logprobs
first differed, and where its tokens left the reference."""

from html import escape
from typing import Any

WIDTH = 640  # the strip's drawing width; the SVG scales to the page
HEIGHT = 14
# Agreeing tokens with bitwise logprobs / agreeing tokens after the first logprob difference /
# tokens after the divergence / a slot that could not be compared.
COLOURS = {"same": "#2e9d5b", "logprobs": "#e0a526", "diverged": "#d64541", "refused": "#9aa0a6"}


def _rect(x0: float, x1: float, kind: str, title: str) -> str:
    return (
        f'<rect class="{kind}" x="{x0:.2f}" y="0" width="{max(x1 - x0, 0):.2f}" height="{HEIGHT}" '
        f'fill="{COLOURS[kind]}"><title>{escape(title)}</title></rect>'
    )


def regions(slot: dict[str, Any], n_predict: int) -> list[tuple[int, int, str]]:
    """(first token, end token, kind) spans covering the slot's n_predict tokens."""
    if slot.get("refused") or slot.get("divergence_at") is None:
        return [(0, n_predict, "refused")]
    at = min(slot["divergence_at"], n_predict)
    first = slot.get("logprob_first_diff_at")
    first = at if first is None else min(first, at)
    spans = [(0, first, "same"), (first, at, "logprobs"), (at, n_predict, "diverged")]
    return [span for span in spans if span[1] > span[0]]


def _span_title(start: int, end: int, kind: str) -> str:
    what = {"same": "same tokens, bitwise logprobs", "logprobs": "same tokens, logprobs differ",
            "diverged": "left the reference", "refused": "not compared"}[kind]
    return f"tokens {start}-{end - 1}: {what}"


def strip_svg(slot: dict[str, Any], n_predict: int) -> str:
    """The slot's strip as inline SVG, with a marker at the divergence."""
    scale = WIDTH / max(n_predict, 1)
    parts = [_rect(start * scale, end * scale, kind, _span_title(start, end, kind))
             for start, end, kind in regions(slot, n_predict)]
    at = slot.get("divergence_at")
    if at is not None and at < n_predict and not slot.get("refused"):
        x = at * scale
        parts.append(f'<line class="divergence" x1="{x:.2f}" y1="-3" x2="{x:.2f}" y2="{HEIGHT + 3}" '
                     'stroke="#111" stroke-width="2"/>')
    return (
        f'<svg class="strip-svg" viewBox="0 -3 {WIDTH} {HEIGHT + 6}" preserveAspectRatio="none" '
        f'role="img" aria-label="slot {slot.get("i")} tokens">{"".join(parts)}</svg>'
    )


def _fmt(value: Any, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def slot_label(slot: dict[str, Any], n_predict: int) -> str:
    """What the strip shows, in words: prompt, stream, rate, divergence and margin, logprobs."""
    bits = [f"slot {slot.get('i')}"]
    if "prompt" in slot:
        bits.append(f"prompt {slot['prompt']}")
    if slot.get("refused"):
        return " · ".join([*bits, f"refused: {slot['refused']}"])
    bits.append(f"stream {slot.get('stream_mode', '?')}")
    bits.append(f"{_fmt(slot.get('decode_tok_s'), '.1f')} tok/s")
    at = slot.get("divergence_at")
    if at is not None and at < n_predict:
        bits.append(f"leaves the reference at token {at} (top-2 margin "
                    f"{_fmt(slot.get('top2_margin_at_divergence'), '.4g', 'not recorded')})")
    elif at is not None:
        bits.append("same tokens throughout")
    if slot.get("logprobs_bitwise_equal") is True:
        bits.append("logprobs bitwise equal")
    elif slot.get("logprobs_bitwise_equal") is False:
        bits.append(f"logprobs differ by up to {_fmt(slot.get('logprob_max_abs_diff'), '.3g')} "
                    f"from token {slot.get('logprob_first_diff_at')}")
    return " · ".join(bits)


def strip_row(band_c: int, slot: dict[str, Any], n_predict: int) -> str:
    """One slot: its label above its strip, with data attributes a reader (or a test) can query."""
    at = slot.get("divergence_at")
    data = (f'data-band="{band_c}" data-slot="{slot.get("i")}" '
            f'data-divergence="{"" if at is None else at}" data-stream="{escape(str(slot.get("stream_mode", "")))}"')
    conflict = slot.get("stream_mode_conflict")
    note = f'<div class="conflict">{escape(conflict)}</div>' if conflict else ""
    return (f'<div class="strip" {data}><div class="label">{escape(slot_label(slot, n_predict))}</div>'
            f'{strip_svg(slot, n_predict)}{note}</div>')


def legend() -> str:
    names = {"same": "same tokens, bitwise logprobs", "logprobs": "same tokens, logprobs differ",
             "diverged": "left the m=1 reference", "refused": "not compared"}
    items = "".join(f'<span><i style="background:{COLOURS[k]}"></i>{v}</span>' for k, v in names.items())
    return f'<div class="legend">{items}<span><b>|</b> divergence</span></div>'
