"""Headless Chromium (Debian's `chromium` package) for the report tests; None when not installed."""

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
    # A screenshot only once the page is painted through: on a busy machine (CI, beside the
    # other test worker) one was taken with the amber strips not yet drawn (144 of > 1,000 pixels).
    "--run-all-compositor-stages-before-draw", "--virtual-time-budget=5000",
]


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def run_chromium(page: Path, profile: Path, *action: str) -> str:
    """Open `page` with a fresh profile and one action (--dump-dom, --screenshot=...); its stdout."""
    binary = chromium()
    assert binary is not None
    command = [binary, *FLAGS, f"--user-data-dir={profile}", *action, page.absolute().as_uri()]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB bytes) of an 8-bit RGB or RGBA, non-interlaced PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert header is not None
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    channels = 3 if colour == 2 else 4
    raw, stride, rows, previous = zlib.decompress(idat), width * channels, [], bytes(width * channels)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up, corner = previous[x], previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        previous = bytes(line)
        rows.append(bytes(b for i, b in enumerate(line) if i % channels < 3))
    return width, height, rows


def count_colour(rows: list[bytes], rgb: tuple[int, int, int], tolerance: int = 6) -> int:
    """How many pixels are within `tolerance` of `rgb` in every channel."""
    n = 0
    for row in rows:
        for x in range(0, len(row), 3):
            if all(abs(row[x + k] - rgb[k]) <= tolerance for k in range(3)):
                n += 1
    return n
