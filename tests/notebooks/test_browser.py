"""The reference reports in a real browser at 1,400 px: every image loads, every link resolves, no
table overflows or needs a sideways scroll inside its box, no text is cut by its box; and every table
a report shows names its CSV, which exists beside the figures.

Renders the reference profile into a temporary copy of the repository (so a colleague's `make all`
is not disturbed), then opens the index and every report in headless Chromium with a small check
script added, and reads the script's verdict back from ``--dump-dom``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

import pytest

if TYPE_CHECKING:
    from conftest import Rendered  # tests/notebooks/conftest.py: the one render of the reference profile

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=10000",
    "--dump-dom",
]
CHECK_SCRIPT = """<script>
window.addEventListener('load', function () {
  var width = document.documentElement.clientWidth;
  var images = Array.from(document.images).filter(function (i) { return !(i.complete && i.naturalWidth > 0); })
    .map(function (i) { return (i.getAttribute('src') || '').slice(0, 80); });
  var links = Array.from(document.querySelectorAll('a[href]')).map(function (a) { return a.getAttribute('href'); });
  var anchors = links.filter(function (h) { var id = h.slice(1);
    return h[0] === '#' && h.length > 1 && !document.getElementById(id) && !document.getElementById(decodeURIComponent(id)); });
  function scrolls(el) {  // a table inside a horizontally scrolling box does not overflow the page
    for (var e = el.parentElement; e && e !== document.body; e = e.parentElement) {
      var o = getComputedStyle(e).overflowX;
      if ((o === 'auto' || o === 'scroll') && e.getBoundingClientRect().right <= width + 1) return true; }
    return false; }
  var wide = Array.from(document.querySelectorAll('table')).filter(function (t) {
    var r = t.getBoundingClientRect(); return (r.right > width + 1 || r.left < -1) && !scrolls(t); })
    .map(function (t) { return (t.innerText || '').slice(0, 80); });
  var scrolled = Array.from(document.querySelectorAll('table')).filter(function (t) {  // a box the reader must scroll
    for (var e = t.parentElement; e && e !== document.body; e = e.parentElement) {
      var o = getComputedStyle(e).overflowX;
      if ((o === 'auto' || o === 'scroll') && e.scrollWidth > e.clientWidth + 1) return true; }
    return false; }).map(function (t) { return (t.innerText || '').slice(0, 80); });
  var cut = Array.from(document.querySelectorAll('body *')).filter(function (e) {  // text clipped by its box
    var s = getComputedStyle(e);
    if (!(s.overflowX === 'hidden' || s.overflowX === 'clip') || !(e.innerText || '').trim()) return false;
    return e.scrollWidth > e.clientWidth + 1 && e.clientWidth > 0; }).map(function (e) { return (e.innerText || '').slice(0, 80); });
  var small = [];  // e-notation numbers in the text a reader sees (tables and prose, not code)
  var walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (var node = walker.nextNode(); node; node = walker.nextNode()) {
    var host = node.parentElement;
    if (!host || host.closest('pre, code, script, style, .jp-InputArea') || !host.getClientRects().length) continue;
    var hit = node.textContent.match(/.{0,40}\\d\\.\\d+e[-+]\\d\\d.{0,20}/);
    if (hit) small.push(hit[0]); }
  var markdown = [];  // markdown shown as text: **bold**, `code` (outside code, pre and scripts)
  var walker2 = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (var n2 = walker2.nextNode(); n2; n2 = walker2.nextNode()) {
    var el = n2.parentElement;
    if (!el || el.closest('pre, code, script, style, .jp-InputArea, textarea') || !el.getClientRects().length) continue;
    var lit = n2.textContent.match(/.{0,30}(\\*\\*[^*\\s][^*]*\\*\\*|`[^`\\s][^`]*`).{0,10}/);
    if (lit) markdown.push(lit[0]); }
  var fold = {};  // where the decision's answer and its table end, from the top of the page
  ['decision', 'evidence'].forEach(function (id) { var e = document.getElementById(id);
    if (e) fold[id] = e.getBoundingClientRect().bottom + window.scrollY; });
  var out = document.createElement('pre'); out.id = 'kvstudy-check';
  out.textContent = JSON.stringify({width: width, page_width: document.documentElement.scrollWidth, broken_images: images, links: links, missing_anchors: anchors,
                                    wide_tables: wide, scrolled_tables: scrolled, cut_text: cut, e_notation: small,
                                    markdown: markdown, fold: fold, height: window.innerHeight});
  document.body.appendChild(out);
});
</script>"""

pytestmark = [
    pytest.mark.notebooks,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)"),
]


@pytest.fixture(scope="module")
def rendered(reference: Rendered) -> Path:
    """The report folder of the one render of the reference profile (tests/notebooks/conftest.py)."""
    return reference.reports


def browser_check(page: Path, profile_dir: Path, window: str = "1400,1000") -> dict:
    """Open ``page`` with the check script added, in a window of ``window`` pixels; the script's findings."""
    probe = page.with_name(f".check-{page.name}")
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", CHECK_SCRIPT + "</body>", 1), encoding="utf-8")
    try:
        out = subprocess.run(
            [CHROMIUM, *FLAGS, f"--window-size={window}", f"--user-data-dir={profile_dir}", probe.as_uri()],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    finally:
        probe.unlink()
    match = re.search(r'<pre id="kvstudy-check">(.*?)</pre>', out.stdout, re.S)
    assert match, f"{page.name}: the check script did not report (chromium: {out.stderr[-500:]})"
    import html

    return json.loads(html.unescape(match.group(1)))


def local_target(page: Path, href: str) -> Path | None:
    """The file a relative link points to, or None for an external, data or in-page link."""
    parsed = urlparse(href)
    if parsed.scheme in {"http", "https", "mailto", "data", "javascript"} or href.startswith("#"):
        return None
    return (page.parent / unquote(parsed.path)).resolve()


def test_index_and_reports_open_cleanly_in_chromium(rendered: Path, tmp_path: Path) -> None:
    pages = [rendered / "index.html", *sorted(p for p in rendered.glob("*.html") if p.name != "index.html")]
    assert len(pages) >= 5, [p.name for p in pages]
    for number, page in enumerate(pages):
        result = browser_check(page, tmp_path / f"chromium-{number}")
        assert 0 < result["page_width"] <= result["width"] + 1, (page.name, "the page scrolls sideways")
        assert result["broken_images"] == [], (page.name, result["broken_images"])
        assert result["missing_anchors"] == [], (page.name, result["missing_anchors"])
        assert result["wide_tables"] == [], (page.name, result["wide_tables"])
        assert result["scrolled_tables"] == [], (
            page.name,
            "tables the reader must scroll sideways",
            result["scrolled_tables"],
        )
        assert result["cut_text"] == [], (page.name, "text cut by its box", result["cut_text"])
        assert result["e_notation"] == [], (page.name, "numbers in e-notation (kvstudy.formats)", result["e_notation"])
        assert result["markdown"] == [], (page.name, "markdown shown as text", result["markdown"])
        missing = [h for h in result["links"] if (t := local_target(page, h)) is not None and not t.exists()]
        assert missing == [], (page.name, missing)
    index_links = browser_check(pages[0], tmp_path / "chromium-index")["links"]
    assert {p.name for p in pages[1:]} <= set(index_links), "the index links every report"
    failed = sorted(p.name for p in pages if p.name.endswith(".failed.html"))
    assert failed == [], f"notebooks failed on the reference profile: {failed}"


def test_every_table_a_report_shows_has_its_csv(rendered: Path) -> None:
    root = rendered.parents[1]
    for page in sorted(p for p in rendered.glob("*.html") if p.name != "index.html"):
        text = page.read_text(encoding="utf-8")
        starts = [m.start() for m in re.finditer(r"<table\b", text)]
        assert starts, page.name
        for start, end in zip(starts, [*starts[1:], len(text)]):
            note = re.search(r"As CSV: <code>([^<]+)</code>", text[start:end])
            head = " ".join(re.sub(r"<[^>]+>", " ", text[start : start + 300]).split())[:60]
            assert note, (page.name, "a table without its CSV", head)
            assert (root / note.group(1)).is_file(), (page.name, note.group(1))


def test_kv_precision_settings_say_what_came_from_the_capture(rendered: Path) -> None:
    import csv

    from kvstudy.report.notebook import DEFAULT, FROM_CAPTURE

    path = rendered.parents[1] / "figures" / "reference" / "07-settings.csv"
    origins = {row["setting"]: row["origin"] for row in csv.DictReader(path.open(encoding="utf-8"))}
    assert origins["gsm8k_n"] == origins["retrieval_lengths"] == FROM_CAPTURE, origins
    assert origins["alpha"] == DEFAULT, origins  # the analysis's own level is the notebook's


def test_no_report_draws_a_figure_twice(rendered: Path) -> None:
    for page in sorted(p for p in rendered.glob("*.html") if p.name != "index.html"):
        images = re.findall(r'src="data:image/png;base64,([^"]+)"', page.read_text(encoding="utf-8"))
        assert len(images) == len(set(images)), (page.name, "a figure is shown twice")


def test_the_decision_and_its_table_are_above_the_fold(rendered: Path, tmp_path: Path) -> None:
    """At 1,366 x 768, a laptop's browser, the answer and the 16-bit | FP8 table end within the first screen."""
    result = browser_check(rendered / "index.html", tmp_path / "chromium-fold", window="1366,768")
    # the visible height: 768 less what the browser's own window takes (headless Chromium: about 625)
    assert result["width"] <= 1366 and 500 < result["height"] <= 768, result
    assert set(result["fold"]) == {"decision", "evidence"}, result["fold"]
    assert result["fold"]["decision"] < result["fold"]["evidence"] <= result["height"], result["fold"]
    answer = re.search(
        r'<h1 id="decision"[^>]*>(.*?)</h1>', (rendered / "index.html").read_text(encoding="utf-8"), re.S
    )
    assert answer and len(answer.group(1).split()) <= 30, answer
    assert answer.group(1).split(":")[0] in {"Turn FP8 on", "Keep 16-bit", "Not decided yet"}
    assert "seed 0" not in (rendered / "index.html").read_text(encoding="utf-8")  # no internal names
