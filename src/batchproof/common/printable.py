"""Text from a server or a file, made safe for a terminal line (shared by probe, check and report)."""

# A server's error message, a replica id or a witness's string can carry ANSI escapes (clear the
# screen, retitle the window, hide text, forge a PASS line), carriage returns and bidi overrides
# (make a line read differently from its bytes). Each such character is written as its visible
# escape instead, and a line is cut at a bound so that one field cannot flood the terminal.

MAX_CHARS = 2000  # far above any line we print ourselves; only a hostile or broken field reaches it

# C0 controls (ESC, CR, BS, ... and newline and tab too: one field stays one line), DEL, the C1
# controls (0x9b is a one-byte CSI on some terminals), line and paragraph separators, and the
# bidirectional embeddings, overrides and isolates ("Trojan Source", CVE-2021-42574).
_UNSAFE = [*range(0x00, 0x20), *range(0x7F, 0xA0), 0x061C, 0x200E, 0x200F, 0x2028, 0x2029,
           *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_ESCAPES = {code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" for code in _UNSAFE}


def printable(text: str, max_chars: int = MAX_CHARS) -> str:
    """`text` with every control character shown as its escape (`\\x1b`, `\\u202e`), cut to
    `max_chars` characters of the original with a note of how many were left out."""
    cut = ""
    if len(text) > max_chars:
        cut = f"... ({len(text) - max_chars} more characters)"
        text = text[:max_chars]  # before escaping, so a huge field costs nothing to show
    return text.translate(_ESCAPES) + cut
