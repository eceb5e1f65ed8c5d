"""The HTML report, analysed from the recorded MTP-CP hang and rendered by a real headless Chromium.

Static checks read the HTML text; browser checks read the DOM after the page's script ran
(``--dump-dom``) and the pixels of a screenshot. In CI (env ``CI`` set) a missing Chromium fails;
install it with ``scripts/install-chromium.sh``.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import unavailable
from mtpdiag.analysis import diagnose
from mtpdiag.inputs import load_paths
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Report, Snapshot, replace
from mtpdiag.report import html as html_report

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "captures" / "mtp_cp_pp"
SITE_FUNCTION = "MTPLossLoggingHelper.reduce_loss_in_tracker"
HOSTILE = '<script>alert(1)</script><b id=pwned title="x">pwn</b>'
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


# ---------------------------------------------------------------- building reports from the recording


def recorded_snapshot() -> Snapshot:
    return load_paths(sorted(str(p) for p in FIXTURE.glob("rank*.json")))


def recorded_layout(world_size: int | None = None) -> ParallelLayout:
    scenario = json.loads((FIXTURE / "scenario.json").read_text())
    sizes = {k: scenario["layout"][k] for k in ("tp", "cp", "pp", "ep")}
    return ParallelLayout.for_world(world_size or scenario["world_size"], **sizes)


def with_function_renamed(snapshot: Snapshot, rank: int, old: str, new: str) -> Snapshot:
    """The snapshot with one rank's frames named ``old`` renamed to ``new`` (a hostile target)."""

    def rename(capture):
        threads = tuple(
            replace(t, frames=tuple(replace(f, function=new) if f.function == old else f for f in t.frames))
            for t in capture.threads
        )
        return replace(capture, threads=threads)

    return replace(snapshot, captures=tuple(rename(c) if c.rank == rank else c for c in snapshot.captures))


def replicated_snapshot(snapshot: Snapshot, dp: int) -> Snapshot:
    """The 4-rank recording repeated over ``dp`` data-parallel replicas (cp=2, pp=2): 4*dp ranks that
    hang the same way, each with the recorded stack of the fixture rank at its cp and pp coordinates."""
    by_rank = {c.rank: c for c in snapshot.captures}
    world = 4 * dp
    captures = []
    for rank in range(world):
        source = by_rank[(rank % 2) + 2 * (rank // (2 * dp))]  # cp is the fastest digit, pp the slowest
        env = (
            replace(source.env, RANK=str(rank), WORLD_SIZE=str(world))
            if source.env.RANK
            else replace(source.env, WORLD_SIZE=str(world))
        )
        captures.append(replace(source, rank=rank, pid=100000 + rank, env=env))
    return replace(snapshot, captures=tuple(captures))


@pytest.fixture(scope="module")
def report() -> Report:
    return diagnose(recorded_snapshot(), recorded_layout())


@pytest.fixture(scope="module")
def page(report, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("html") / "report.html"
    path.write_text(html_report.render(report), encoding="utf-8")
    return path


# ---------------------------------------------------------------- static checks


def test_page_is_self_contained(page):
    text = page.read_text()
    assert "http://" not in text and "https://" not in text
    parsed = parse(text)
    assert not [e for e in parsed.elements if {"src", "href"} & set(e.attrs) or e.tag == "link"]
    assert "url(" not in text and "@import" not in text
    csp = [e.attrs["content"] for e in parsed.elements if e.attrs.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in csp[0]


def test_report_strings_from_targets_are_escaped():
    snapshot = with_function_renamed(recorded_snapshot(), 2, SITE_FUNCTION, HOSTILE)
    hostile = diagnose(snapshot, recorded_layout())
    assert any(f.function == HOSTILE for v in hostile.ranks for f in hostile.stack_of(v))  # the rename took
    text = html_report.render(hostile)
    assert text.count("<script") == 2  # the data blob and the page's own script, nothing injected
    assert "<b id=pwned" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text  # shown as text (legend, sites, sentences)
    assert "\\u003cscript\\u003ealert(1)" in text  # and inert inside the JSON data


def test_undecodable_names_still_make_a_utf8_file():
    snapshot = with_function_renamed(recorded_snapshot(), 1, "ring_attention", "ring\udcffattention")
    text = html_report.render(diagnose(snapshot, recorded_layout()))
    assert "ring?attention" in text.encode("utf-8").decode("utf-8")


def test_without_a_layout_the_grid_is_a_plain_rank_list():
    report = diagnose(recorded_snapshot(), None)
    parsed = parse(html_report.render(report))
    cells = parsed.by_testid("rank-cell")
    assert sorted(parsed.text_of(c).split()[1] for c in cells) == ["r0", "r1", "r2", "r3"]
    assert "pp0" not in parsed.text_of(parsed.by_testid("grid")[0])


# ---------------------------------------------------------------- in a real headless browser


def _find_chromium() -> str | None:
    return shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's Chromium, installed by scripts/install-chromium.sh the first time these tests run without it."""
    path = _find_chromium()
    if path is None:
        script = Path(__file__).resolve().parents[2] / "scripts" / "install-chromium.sh"
        done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=1200)
        path = _find_chromium()
        if path is None:
            said = (done.stderr or done.stdout).strip().splitlines()
            unavailable(f"chromium is not installed ({said[-1] if said else 'scripts/install-chromium.sh failed'})")
    return path


def run_chromium(chromium: str, tmp_path: Path, url: str, *args: str) -> str:
    profile = tmp_path / "profile"
    profile.mkdir(exist_ok=True)
    result = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url],
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_browser_renders_grid_and_findings(chromium, page, report, tmp_path):
    dom = parse(run_chromium(chromium, tmp_path, page.as_uri(), "--dump-dom"))
    assert dom.root_attrs.get("data-ready") == "1"  # the script ran to its end
    group_of = {r: i for i, g in enumerate(report.sites) for r in g.ranks}
    views = {v.rank: v for v in report.ranks}
    cells = dom.by_testid("rank-cell")
    assert len(cells) == 4
    assert "hidden" in dom.by_testid("stack-pane")[0].attrs  # no pane until a cell is chosen
    for cell in cells:
        rank = int(dom.text_of(cell).split()[1].lstrip("r"))
        assert f"g{group_of[rank]}" in cell.attrs["class"].split()
        # the hover text, written by the script from the JSON data: label, what it does, its stack
        title = cell.attrs.get("title", "")
        assert title.startswith(f"rank {rank} (") and report.stack_of(views[rank])[0].function in title
    findings = dom.by_testid("finding")
    assert [f.attrs["data-id"] for f in findings] == [f.id for f in report.findings]
    assert "mtp-cp-gated-reduce" in [f.id for f in report.findings]
    for element, finding in zip(findings, report.findings, strict=True):
        assert finding.summary in dom.text_of(element)
    legend = dom.text_of(dom.by_testid("legend")[0])
    assert "reduce_loss_in_tracker" in legend and "ring_attention" in legend


def test_rank_fragment_opens_that_ranks_stack(chromium, page, tmp_path):
    dom = parse(run_chromium(chromium, tmp_path, page.as_uri() + "#rank=2", "--dump-dom"))
    pane = dom.by_testid("stack-pane")[0]
    assert "hidden" not in pane.attrs and pane.attrs.get("data-rank") == "2"
    frames = [dom.text_of(li) for li in dom.children_of(dom.by_testid("stack-frames")[0], "li")]
    assert frames[0].startswith("all_reduce ")
    site = [f for f in frames if "call site" in f]
    assert len(site) == 1 and site[0].startswith(SITE_FUNCTION)
    assert dom.text_of(dom.children_of(pane, "h3")[0]).startswith("rank 2 (")


def test_hostile_function_name_stays_inert_in_the_browser(chromium, tmp_path):
    snapshot = with_function_renamed(recorded_snapshot(), 2, SITE_FUNCTION, HOSTILE)
    path = tmp_path / "hostile.html"
    path.write_text(html_report.render(diagnose(snapshot, recorded_layout())), encoding="utf-8")
    text = run_chromium(chromium, tmp_path, path.as_uri() + "#rank=2", "--dump-dom")
    dom = parse(text)
    assert dom.root_attrs.get("data-ready") == "1"
    assert not [e for e in dom.elements if e.attrs.get("id") == "pwned"]
    frames = [dom.text_of(li) for li in dom.children_of(dom.by_testid("stack-frames")[0], "li")]
    assert any(f.startswith(HOSTILE) for f in frames)  # shown as text in the pane


def test_screenshot_shows_each_site_group_in_its_colour(chromium, page, report, tmp_path):
    shot = tmp_path / "report.png"
    run_chromium(chromium, tmp_path, page.as_uri(), f"--screenshot={shot}", "--window-size=1280,900")
    assert shot.exists() and shot.stat().st_size > 20_000
    width, height, pixels = decode_png(shot.read_bytes())
    assert (width, height) == (1280, 900)
    for i, _ in enumerate(report.sites):
        # a rank cell is about 1400 pixels; the legend's swatch alone about 170
        colour = bytes.fromhex(html_report.PALETTE[i][1:])
        assert pixels.count(colour) > 1000, f"no cell of group {i} in {html_report.PALETTE[i]} on screen"


def test_sixteen_thousand_ranks_still_render(chromium, tmp_path):
    snapshot = replicated_snapshot(recorded_snapshot(), dp=4096)
    report = diagnose(snapshot, recorded_layout(world_size=16384))
    path = tmp_path / "big.html"
    path.write_text(html_report.render(report), encoding="utf-8")
    assert path.stat().st_size < 8_000_000
    dom = run_chromium(chromium, tmp_path, path.as_uri() + "#rank=16383", "--dump-dom")
    assert dom.count('data-testid="rank-cell"') == 16384
    assert 'data-ready="1"' in dom and 'data-rank="16383"' in dom


# ---------------------------------------------------------------- helpers


class Element:
    def __init__(self, tag: str, attrs: dict, parent: Element | None):
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.parts: list = []  # text and child elements, in order


VOID = {"meta", "br", "img", "input", "link", "hr", "col", "wbr", "source"}


class ParsedPage(HTMLParser):
    """A small DOM from html.parser: enough to find elements by data-testid and read their text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Element("#root", {}, None)
        self.current = self.root
        self.elements: list[Element] = []
        self.root_attrs: dict = {}

    def handle_starttag(self, tag, attrs):
        element = Element(tag, {k: (v if v is not None else "") for k, v in attrs}, self.current)
        if tag == "html":
            self.root_attrs = element.attrs
        self.elements.append(element)
        self.current.parts.append(element)
        if tag not in VOID:
            self.current = element

    def handle_endtag(self, tag):
        node = self.current
        while node is not self.root and node.tag != tag:
            node = node.parent
        if node is not self.root:
            self.current = node.parent

    def handle_data(self, data):
        self.current.parts.append(data)

    def by_testid(self, testid: str) -> list[Element]:
        return [e for e in self.elements if e.attrs.get("data-testid") == testid]

    def text_of(self, element: Element) -> str:
        return "".join(
            p if isinstance(p, str) else self.text_of(p)
            for p in element.parts
            if isinstance(p, str) or p.tag not in ("script", "style")
        )

    @staticmethod
    def children_of(element: Element, tag: str) -> list[Element]:
        return [p for p in element.parts if isinstance(p, Element) and p.tag == tag]


def parse(text: str) -> ParsedPage:
    parsed = ParsedPage()
    parsed.feed(text)
    return parsed


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and every pixel as RGB bytes, for 8-bit RGB/RGBA non-interlaced PNGs (Chromium's)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, bytearray()
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
    assert depth == 8 and interlace == 0 and colour_type in (2, 6)
    channels = 3 if colour_type == 2 else 4
    stride = width * channels
    raw = zlib.decompress(bytes(idat))
    previous = bytearray(stride)
    pixels: list[bytes] = []
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        unfilter(kind, line, previous, channels)
        pixels += [bytes(line[x : x + 3]) for x in range(0, stride, channels)]
        previous = line
    return width, height, pixels


def unfilter(kind: int, line: bytearray, previous: bytearray, bpp: int) -> None:
    """Undo one PNG scanline filter in place (PNG spec, section 9)."""
    if kind == 0:
        return
    if kind == 2:
        line[:] = bytes((a + b) & 255 for a, b in zip(line, previous, strict=True))
        return
    for x in range(len(line)):
        left = line[x - bpp] if x >= bpp else 0
        up = previous[x]
        if kind == 1:
            line[x] = (line[x] + left) & 255
        elif kind == 3:
            line[x] = (line[x] + (left + up) // 2) & 255
        elif kind == 4:
            corner = previous[x - bpp] if x >= bpp else 0
            p = left + up - corner
            pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
            line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        else:
            raise ValueError(f"bad PNG filter {kind}")


def test_uncaptured_ranks_of_a_moe_layout_with_its_own_expert_tp_show_as_gaps():
    """tp=2 with etp=1 and ep=4 over 12 ranks: etp*ep*pp divides the world, tp*ep*pp does not. The grid's
    full layout must be rebuilt with etp, or the ranks missing from the capture vanish from the grid."""
    from support.captures import load_scenario, tile

    snapshot, small, _ = load_scenario("tp_broadcast")
    big = ParallelLayout.for_world(12, tp=2, ep=4, etp=1)
    tiled = tile(snapshot, small, big)
    partial = replace(tiled, captures=tuple(c for c in tiled.captures if c.rank not in (5, 6)))
    page = html_report.render(diagnose(partial, big))
    for rank in (5, 6):
        assert f'class=miss title="rank {rank}: not captured"' in page
    assert page.count("class=miss") == 2
