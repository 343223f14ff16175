"""The report as a real browser renders it: headless Chromium reads the DOM back and paints
the strips (a screenshot whose pixels are counted). Skipped where Chromium is not installed."""

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from batchproof.cli import main
from tests.helpers.browser import chromium, count_colour, png_pixels, run_chromium
from tests.report.witness_sample import sample_witness

pytestmark = pytest.mark.skipif(chromium() is None, reason="chromium is not installed (apt-get install chromium)")


class Elements(HTMLParser):
    """Every element's tag, attributes and direct text, in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str], list[str]]] = []
        self.stack: list[int] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.found.append((tag, dict(attrs), []))
        if tag not in ("meta", "br", "img"):
            self.stack.append(len(self.found) - 1)

    def handle_endtag(self, tag: str) -> None:
        open_tags = [self.found[i][0] for i in self.stack]
        if tag in open_tags:  # close it and anything left open inside it; a stray end tag is ignored
            del self.stack[len(open_tags) - 1 - open_tags[::-1].index(tag):]

    def handle_data(self, data: str) -> None:
        if self.stack:
            self.found[self.stack[-1]][2].append(data)

    def where(self, **attrs: str) -> list[tuple[str, dict[str, str], list[str]]]:
        return [e for e in self.found if all(e[1].get(k.rstrip("_")) == v for k, v in attrs.items())]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("report")
    witness = folder / "witness.json"
    witness.write_text(json.dumps(sample_witness()))
    assert main(["report", str(witness), "-o", str(folder / "report.html")]) == 0
    return folder / "report.html"


def test_the_browser_reads_the_verdict_the_reasons_and_a_strip_per_slot(report: Path, tmp_path: Path) -> None:
    dom = Elements()
    dom.feed(run_chromium(report, tmp_path / "profile", "--dump-dom"))
    verdict = dom.where(id="verdict")
    assert len(verdict) == 1 and "".join(verdict[0][2]).strip() == "NOT ADMISSIBLE"
    reasons = ["".join(e[2]) for e in dom.found if e[0] == "li"]
    assert any(r.startswith("S5: c=4 slot 1 diverges from m=1 at 5 < declared_min 6") for r in reasons)
    assert any(r.startswith("logprobs: c=4 logprobs differ from m=1 by up to 1e-05") for r in reasons)
    assert any(r.startswith("S7: decode at c=4 is 15.0 tok/s, 37.5% of c=1's 40.0 tok/s") for r in reasons)
    strips = [e for e in dom.found if e[1].get("class") == "strip"]
    assert [(e[1]["data-band"], e[1]["data-slot"], e[1]["data-divergence"]) for e in strips] == [
        ("1", "0", "12"), ("4", "0", "12"), ("4", "1", "5"), ("4", "2", "12"), ("4", "3", "12")]
    diverged = [e for e in dom.found if e[0] == "rect" and e[1].get("class") == "diverged"]
    assert len(diverged) == 1  # only slot 1 left its reference
    assert len(dom.where(id="s7-line")) == 1 and len(dom.where(class_="bar below")) == 1
    assert any("arrived buffered" in "".join(e[2]) for e in dom.where(class_="conflict"))


def test_the_browser_paints_the_strips(report: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    run_chromium(report, tmp_path / "profile", "--window-size=900,1100", f"--screenshot={shot}")
    width, height, rows = png_pixels(shot)
    assert (width, height) == (900, 1100)
    # Green (bitwise), amber (logprobs differ) and red (diverged, the verdict badge) all painted.
    assert count_colour(rows, (0x2E, 0x9D, 0x5B)) > 1000
    assert count_colour(rows, (0xE0, 0xA5, 0x26)) > 1000
    assert count_colour(rows, (0xD6, 0x45, 0x41)) > 1000
