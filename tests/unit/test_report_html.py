"""The HTML report (analyze --html): one self-contained file with the terminal report's content
and five plots, three of them on one shared UTC time axis with the recording's saves marked;
the saves listed; capture strings escaped; and, where Chromium is installed, what a browser
really shows."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from slotscope.capture.writer import CaptureWriter
from slotscope.capture.tables import schema
from slotscope.analyzer.analysis import analyze
from slotscope.capture.reader import Capture
from slotscope.analyzer.job import Job, utc_ns
from slotscope.analyzer.plot_data import SaveSpan, TimeContext
from slotscope.analyzer.report_html import write_html
from slotscope.analyzer.thresholds import Thresholds
from slotscope.analyzer.units import clock
from unit_helpers import (REPO, START_NS, THREE_SAVES, assert_one_line_error, proc, run_slotscope, sc,
                          three_saves)

pytestmark = pytest.mark.unit

SAMPLE = str(REPO / "analyzer" / "sample")
PLOTS = ("occupancy", "link", "ranks", "latency", "sizes")
TIME_PLOTS = ("occupancy", "link", "ranks")


class Page(HTMLParser):
    """What the report's HTML holds: tags with attributes, text, per figure its SVGs and notes,
    and per section the rows of its tables (their cells' text) and its other text."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.figures: dict[str, dict] = {}
        self.rows: dict[str, list[tuple[dict, list[str]]]] = {}     # section id -> (tr attributes, cells)
        self.section_text: dict[str, list[str]] = {}
        self._figure: str | None = None
        self._section: str | None = None
        self._in_note = False
        self._in_cell = False
        self._in_svg = 0
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "section" and "id" in a:
            self._section = a["id"]
            self.rows[self._section], self.section_text[self._section] = [], []
        elif tag == "tr" and self._section:
            self.rows[self._section].append((a, []))
        elif tag in ("td", "th") and self._section and self.rows[self._section]:
            self.rows[self._section][-1][1].append("")
            self._in_cell = True
        elif tag == "figure" and "data-plot" in a:
            self._figure = a["data-plot"]
            self.figures[self._figure] = {"attrs": a, "svgs": [], "notes": [], "svg_text": []}
        elif tag == "svg" and self._figure:
            if not self._in_svg:
                self.figures[self._figure]["svgs"].append(a)
            self._in_svg += 1
        elif tag == "p" and "note" in (a.get("class") or "").split() and self._figure:
            self._in_note = True

    def handle_endtag(self, tag):
        if tag == "section":
            self._section = None
        elif tag in ("td", "th"):
            self._in_cell = False
        elif tag == "figure":
            self._figure = None
        elif tag == "svg" and self._in_svg:
            self._in_svg -= 1
        elif tag == "p":
            self._in_note = False

    def handle_data(self, data):
        self.text.append(data)
        if self._section:
            self.section_text[self._section].append(data)
            if self._in_cell:
                self.rows[self._section][-1][1][-1] += data
        if self._figure and self._in_note:
            self.figures[self._figure]["notes"].append(data)
        if self._figure and self._in_svg:
            self.figures[self._figure]["svg_text"].append(data)

    def all_text(self) -> str:
        return " ".join(self.text)

    def find(self, tag: str, **attrs) -> list[dict]:
        return [a for t, a in self.tags if t == tag and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())]


def report(paths: list[str], tmp_path: Path, name: str = "report.html", **kw) -> tuple[dict, str, Page]:
    job = Job.open(paths)
    result = analyze(job, "test", **kw)
    out = tmp_path / name
    write_html(job, result, str(out))
    text = out.read_text(encoding="utf-8")
    return result, text, Page(text)


def assert_self_contained(page: Page, text: str) -> None:
    external = re.compile(r"^\s*(https?:|ftp:|//)", re.I)
    for tag, attrs in page.tags:
        assert tag not in ("script", "link", "iframe", "object", "embed"), tag
        for key in ("src", "href", "xlink:href", "action", "poster", "data"):
            value = attrs.get(key)
            assert not (value and external.match(value)), (tag, key, value)
    assert "@import" not in text
    assert not re.search(r"url\(\s*['\"]?\s*(https?:|//)", text, re.I)


def assert_shared_time_axis(page: Page, names=TIME_PLOTS) -> tuple[int, int]:
    """Every axes of every time plot has the same x range and the same left/right edges, and
    the SVGs have the same width: stacked, they line up."""
    xlims, edges, widths = set(), set(), set()
    for name in names:
        fig = page.figures[name]
        attrs = fig["attrs"]
        assert attrs.get("data-time-axis") == "utc", name
        xlims |= set(attrs["data-xlims-utc-ns"].split(";"))
        edges |= set(attrs["data-axes-x"].split(";"))
        assert len(fig["svgs"]) == 1, name
        widths.add(fig["svgs"][0]["width"])
    assert len(xlims) == 1, xlims
    assert len(edges) == 1, edges
    assert len(widths) == 1, widths
    lo, hi = map(int, xlims.pop().split())
    assert hi > lo
    return lo, hi


# --------------------------------------------------------------------------- the shipped sample

@pytest.fixture(scope="module")
def sample_report(tmp_path_factory):
    return report([SAMPLE], tmp_path_factory.mktemp("sample"))


def test_sample_report_verdict_first_and_every_section(sample_report):
    result, text, page = sample_report
    banners = page.find("section", id="verdict")
    assert len(banners) == 1
    assert banners[0]["data-verdict"] == "slot_saturation" == result["verdict"]
    assert banners[0]["data-severity"] == "critical"
    assert "sev-critical" in banners[0]["class"]
    # the banner comes before anything else of substance, the saves right after it
    assert text.index('id="verdict"') < text.index('id="saves"') < text.index('id="findings"') < text.index('id="timeline"')
    body = page.all_text()
    assert "verdict: slot_saturation (critical)" in body
    kinds = {a["data-kind"] for a in page.find("article")}
    assert kinds == {f["kind"] for f in result["findings"]} and {"slot_saturation", "small_sync_writes"} <= kinds
    from slotscope.analyzer import evidence
    titles = {a.get("title") for _, a in page.tags}
    findings_text = " ".join(page.section_text["findings"])
    for f in result["findings"]:
        for key, value in f["evidence"].items():
            if value is None or value == [] or value == {}:
                continue
            # a label a person reads, its JSON key in the title; no raw key in the text (issue 19 point 12)
            assert evidence.label(key) in findings_text and key in titles, key
            assert "_" not in key or not re.search(rf"\b{key}\b", findings_text), key
        assert f["fix"] in body
    for c in result["checklist"]:
        assert c["question"] in body
    for section in ("saves", "findings", "checklist", "timeline", "ranks", "transports", "rpcs", "sizes", "captures"):
        assert page.find("section", id=section), section
    assert "10.0.0.1:2049" in body and "veth1" in body and "WRITE" in body
    assert "6.1.0-57-amd64" in body           # the capture's kernel, in captures and losses
    rank_rows = [t for t, a in page.tags if t == "tr"]
    assert len(rank_rows) >= 1 + 8            # header + 8 ranks, at least


def test_sample_report_has_five_svg_plots_and_no_external_urls(sample_report):
    result, text, page = sample_report
    assert set(page.figures) == set(PLOTS)
    for name in PLOTS:
        assert len(page.figures[name]["svgs"]) == 1, (name, page.figures[name]["notes"])
    assert len(page.find("svg")) == 5
    assert_self_contained(page, text)
    # several inline SVGs in one document: no id may repeat
    ids = [a["id"] for _, a in page.tags if "id" in a]
    assert len(ids) == len(set(ids))
    # the sample's link reports 10 Gb/s: its plot draws the capacity and says how little of it the
    # save used (the peak, 0.031%, not rounded to '0.0%')
    link_text = " ".join(page.figures["link"]["svg_text"])
    [ev] = [f["evidence"] for f in result["findings"] if f["kind"] == "slot_saturation"]
    assert ev["link_speed_bps"] == 10_000_000_000 and 0.0003 < ev["link_peak_util"] < 0.00035
    assert "capacity 10 Gb/s" in link_text and "(peak 0.031% of capacity)" in link_text
    assert "capacity unknown" not in link_text
    assert "limit: 2 transport slots" in " ".join(page.figures["occupancy"]["svg_text"])
    ranks_text = " ".join(page.figures["ranks"]["svg_text"])
    assert all(f"rank {r}" in ranks_text for r in range(8)) and "write" in ranks_text
    latency_text = " ".join(page.figures["latency"]["svg_text"])
    assert "slot wait" in latency_text and "rest of execute" in latency_text
    assert "1,024 WRITE RPCs" in " ".join(page.figures["sizes"]["svg_text"])
    assert len(text) < 2_000_000


def test_sample_time_plots_share_one_utc_axis_around_the_save(sample_report):
    result, _, page = sample_report
    lo, hi = assert_shared_time_axis(page)
    start, end = utc_ns(result["window"]["start"]), utc_ns(result["window"]["end"])
    assert lo < start < end < hi
    assert (hi - lo) < 1.2 * (end - start)     # the save fills the axis


# --------------------------------------------------------------------------- other captures

def _rank_rows(tgid: int, rank: int, t0: int, sizes=(4096, 1 << 20, 65536)) -> list[dict]:
    rows = [sc(tgid, "openat", latency_ns=2_000_000, ts=t0)]
    t = t0 + 3_000_000
    for n in sizes:
        rows.append(sc(tgid, "write", latency_ns=40_000_000, nbytes=n, ts=t))
        t += 50_000_000
    rows.append(sc(tgid, "fsync", latency_ns=300_000_000, ts=t))
    return rows


def test_syscall_only_capture_draws_ranks_and_sizes_and_notes_the_rest(build_capture, tmp_path):
    rows = _rank_rows(100, 0, 1_000_000_000) + _rank_rows(101, 1, 1_010_000_000)
    path = build_capture("sys", syscalls=rows, procs=[proc(100, rank=0), proc(101, rank=1)])
    result, text, page = report([path], tmp_path)
    assert result["rpc"]["by_proc"] == {} and result["verdict"] is not None
    for name in ("occupancy", "link", "latency"):
        fig = page.figures[name]
        assert fig["svgs"] == [], name
        assert "no RPC data" in " ".join(fig["notes"]), name
    for name in ("ranks", "sizes"):
        assert len(page.figures[name]["svgs"]) == 1, (name, page.figures[name]["notes"])
    assert "write calls" in " ".join(page.figures["sizes"]["svg_text"])
    assert "fsync" in " ".join(page.figures["ranks"]["svg_text"])
    assert "no RPC rows" in page.all_text()           # analyze()'s note, shown under the banner
    assert_shared_time_axis(page, ("ranks",))
    assert_self_contained(page, text)


def test_one_rank(build_capture, tmp_path):
    path = build_capture("one", syscalls=_rank_rows(100, 0, 1_000_000_000), procs=[proc(100, rank=0)])
    result, _, page = report([path], tmp_path)
    assert len(result["ranks"]) == 1
    assert "rank 0" in " ".join(page.figures["ranks"]["svg_text"])
    assert len(page.figures["sizes"]["svgs"]) == 1


def test_empty_capture_has_nothing_to_assess(build_capture, tmp_path):
    path = build_capture("empty")
    result, text, page = report([path], tmp_path)
    assert result["verdict"] is None
    banner = page.find("section", id="verdict")[0]
    assert banner["data-severity"] == "none" and "nothing to assess" in page.all_text()
    assert page.find("svg") == []
    for name in PLOTS:
        assert page.figures[name]["notes"], name
    assert "no traced file was written" in " ".join(page.section_text["saves"])
    assert_self_contained(page, text)


# --------------------------------------------------------------------------- the saves of a recording

def test_the_saves_are_listed_after_the_verdict_one_row_each(build_capture, tmp_path):
    result, text, page = report([build_capture(syscalls=three_saves())], tmp_path)
    saves = result["saves"]
    assert len(saves) == 3 and result["save_trend"]
    assert text.index('id="verdict"') < text.index('id="saves"') < text.index('id="findings"')
    assert "3 saves" in " ".join(page.section_text["verdict"])          # the line under the verdict
    (_, head), *rows = page.rows["saves"]
    assert head == ["save", "window", "duration (s)", "what was saved", "bytes", "slowest rank", "verdict",
                    "findings"]
    assert len(rows) == 3
    for (attrs, cells), s, (a, b) in zip(rows, saves, THREE_SAVES):
        assert cells[0] == str(s["number"])
        assert cells[1] == f"{clock(utc_ns(s['start']))} .. {clock(utc_ns(s['end']))} UTC"
        assert cells[2] == f"{b - a:.2f}"
        assert cells[3] == s["what"] and f"step_{s['number']}/" in cells[3]
        assert cells[4] == ("16.0 MiB" if s["number"] == 3 else "8.0 MiB")
        assert re.fullmatch(r"pid 20[12] \(\d+\.\d\d s\)", cells[5]), cells[5]      # no ranks: the pid
        assert cells[6] == s["verdict"]
        assert cells[7] == (", ".join(dict.fromkeys(f["kind"] for f in s["findings"])) or "none")
        assert attrs["class"].startswith("sev-")
    trend = " ".join(page.section_text["saves"])
    assert result["save_trend"]["text"] in trend and "save 3 took" in trend


def test_the_time_axis_carries_one_span_per_save(build_capture):
    job = Job.open([build_capture(syscalls=three_saves())])
    ctx = TimeContext.of(job, analyze(job, "test"))
    assert [s.number for s in ctx.saves] == [1, 2, 3]
    for span, (a, b) in zip(ctx.saves, THREE_SAVES):
        # the result's times are cut to the millisecond
        assert abs(span.start - (START_NS + int(a * 1e9))) <= 1_000_000, span
        assert abs(span.end - (START_NS + int(b * 1e9))) <= 1_000_000, span
        assert ctx.x0 < span.start < span.end < ctx.x1


def test_every_time_plot_marks_each_save(tmp_path):
    from slotscope.analyzer.plots import C_SAVE
    cap = Capture.open(SAMPLE)
    shift = tile_shift(cap.meta)
    one = analyze(Job.open([SAMPLE]), "test")["saves"]
    assert len(one) == 1
    path = tiled_sample(str(tmp_path / "three"), copies=3)
    result, text, page = report([path], tmp_path)
    assert len(result["saves"]) == 3
    expected = [SaveSpan(i + 1, utc_ns(one[0]["start"]) + i * shift, utc_ns(one[0]["end"]) + i * shift)
                for i in range(3)]
    for name in TIME_PLOTS:
        fig = page.figures[name]
        assert len(fig["svgs"]) == 1, (name, fig["notes"])
        spans = [SaveSpan(*map(int, s.split())) for s in fig["attrs"]["data-saves-utc-ns"].split(";")]
        assert [s.number for s in spans] == [1, 2, 3], name
        for got, want in zip(spans, expected):
            assert abs(got.start - want.start) <= 1_000_000 and abs(got.end - want.end) <= 1_000_000, (name, got)
        svg_text = " ".join(fig["svg_text"])
        assert all(f"save {n}" in svg_text for n in (1, 2, 3)) and "shaded: each save" in svg_text, name
        # a shaded span per save on every axes of the plot
        svg = text[text.index(f'id="plot-{name}"'):]
        svg = svg[:svg.index("</figure>")]
        axes = len(fig["attrs"]["data-xlims-utc-ns"].split(";"))
        assert svg.count(f"fill: {C_SAVE}") == 3 * axes, name


def test_capture_strings_are_escaped(build_capture, tmp_path):
    evil = '<script>alert("x")</script>'
    rows = _rank_rows(100, 0, 1_000_000_000)
    for r in rows:
        r["path"] = "/mnt/" + evil
    a = build_capture("cap<script>alert(1)<script>", host=evil, syscalls=rows,
                      procs=[proc(100, rank=0, comm='<img src=x onerror="alert(3)">')])
    # a second host: the rank labels of the timeline then name their host, inside the SVG
    b = build_capture("other", host="b<script>", syscalls=_rank_rows(200, 1, 1_000_000_000),
                      procs=[proc(200, rank=1)])
    result, text, page = report([a, b], tmp_path)
    assert not [t for t, _ in page.tags if t in ("script", "img")]
    assert "<script" not in text.lower() and "<img" not in text.lower()
    body = page.all_text()
    assert "cap<script>alert(1)<script>" in body                  # the path, shown as text
    assert '<img src=x onerror="alert(3)">' in body               # the comm in the rank table
    assert evil in " ".join(page.figures["ranks"]["svg_text"])    # the host in the SVG's text
    assert "&lt;script&gt;" in text


def test_write_html_replaces_the_file_whole_and_names_a_missing_directory(tmp_path):
    job = Job.open([SAMPLE])
    result = analyze(job, "test")
    out = tmp_path / "r.html"
    out.write_text("old")
    write_html(job, result, str(out))
    write_html(job, result, out)                       # a path-like works too
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]     # no temporary left behind
    with pytest.raises(OSError) as exc:
        write_html(job, result, str(tmp_path / "missing" / "r.html"))
    assert "no such directory" in exc.value.strerror and str(tmp_path / "missing") in exc.value.strerror


def test_cli_writes_the_report_and_reports_a_bad_path_in_one_line(tmp_path):
    out = tmp_path / "report.html"
    res = run_slotscope("analyze", SAMPLE, "--html", str(out))
    assert res.returncode == 0, res.stderr
    assert "verdict: slot_saturation" in res.stdout and out.exists()
    res = run_slotscope("analyze", SAMPLE, "--html", str(tmp_path / "nope" / "report.html"))
    assert_one_line_error(res, "cannot write", "no such directory")


def test_importing_the_report_does_not_import_matplotlib():
    code = ("import sys, slotscope.analyzer.report_html, slotscope.analyzer.analysis; "
            "print('matplotlib' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


# --- a large capture built from the sample: many ranks, 64k slot rows, a known link speed

TS_COLUMNS = {"syscall": ["ts_enter", "ts_exit"], "procs": ["ts"], "slots": ["ts"], "netdev": ["ts"],
              "rpc": ["ts_begin", "ts_end", "ts_reserve_start", "ts_reserved", "ts_transmit_start",
                      "ts_first_tx", "ts_last_tx"]}
PID_COLUMNS = {"syscall": ["tgid", "tid"], "procs": ["tgid"], "rpc": ["owner_tgid", "owner_tid"]}


def _add(t: pa.Table, col: str, value: int) -> pa.Table:
    typ = t.schema.field(col).type
    return t.set_column(t.schema.get_field_index(col), col, pc.cast(pc.add(pc.cast(t[col], pa.int64()), value), typ))


def conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
    """The sample's rows in today's schema (columns added since it was recorded are null)."""
    cols = [t[f.name] if f.name in t.column_names else pa.nulls(t.num_rows, f.type) for f in schema]
    return pa.Table.from_arrays(cols, names=schema.names).cast(schema)


def tile_shift(meta: dict) -> int:
    """How far apart tiled_sample lays its copies: the capture's length and the quiet time that
    separates saves (the sample's own quiet time before and after its save is 7.6 s, less)."""
    return meta["stop"]["monotonic_ns"] - meta["start"]["monotonic_ns"] + int(Thresholds().save_gap_s * 1e9)


def tiled_sample(dst: str, copies: int, no_speed: bool = False, skip=()) -> str:
    """The sample `copies` times one after the other, each copy with its own 8 ranks and a save
    of its own; no_speed: its link reports no speed (the sample's reports 10 Gb/s)."""
    cap = Capture.open(SAMPLE)
    m = dict(cap.meta)
    span = tile_shift(m)
    m["stop"] = {**m["stop"], "monotonic_ns": m["stop"]["monotonic_ns"] + span * (copies - 1),
                 "realtime_ns": m["stop"]["realtime_ns"] + span * (copies - 1)}
    w = CaptureWriter(dst)
    w.write_meta(m)
    for name in ("syscall", "procs", "slots", "netdev", "rpc"):
        if name in skip:
            continue
        t = cap.read(name)
        parts = []
        for i in range(copies):
            p = t
            for col in TS_COLUMNS[name]:
                p = _add(p, col, i * span)
            for col in PID_COLUMNS.get(name, []):
                p = _add(p, col, 1000 * i)
            if name == "procs":
                p = _add(p, "rank", 8 * i)
            if name == "netdev":
                for col in ("tx_bytes", "rx_bytes"):          # counters keep counting up
                    p = _add(p, col, i * int(pc.max(t[col]).as_py() - pc.min(t[col]).as_py()))
                if no_speed:
                    p = p.set_column(p.schema.get_field_index("speed_bps"), "speed_bps",
                                     pa.nulls(p.num_rows, pa.int64()))
            parts.append(p)
        w.append(name, conform(pa.concat_tables(parts), schema(name)))
    w.close()
    return dst


def test_large_capture_many_ranks_stays_small_and_aligned(tmp_path):
    path = tiled_sample(str(tmp_path / "big"), copies=10)
    job = Job.open([path])
    assert job.table("slots").num_rows > 50_000
    result, text, page = report([path], tmp_path)
    assert len(result["ranks"]) == 80
    assert len(text) < 3_000_000, len(text)
    lo, hi = assert_shared_time_axis(page)
    # more than 64 ranks: a heatmap of blocked share (an embedded image), not one row of bars each
    ranks_fig = page.figures["ranks"]
    assert "blocked share" in " ".join(ranks_fig["svg_text"])
    assert page.find("image")
    link_text = " ".join(page.figures["link"]["svg_text"])
    assert "capacity 10 Gb/s" in link_text and "capacity unknown" not in link_text
    assert "reduced to" in text                         # the long occupancy series was binned


def test_link_plot_says_when_the_capacity_is_unknown(tmp_path):
    path = tiled_sample(str(tmp_path / "nospeed"), copies=1, no_speed=True)
    _, _, page = report([path], tmp_path)
    link_text = " ".join(page.figures["link"]["svg_text"])
    assert "capacity unknown (the interface reports no speed)" in link_text and "capacity 10 Gb/s" not in link_text
    assert "of capacity" not in link_text


def test_rpcs_without_link_samples(tmp_path):
    path = tiled_sample(str(tmp_path / "nonet"), copies=1, skip=("netdev",))
    result, _, page = report([path], tmp_path)
    assert page.figures["link"]["svgs"] == []
    assert "no link samples" in " ".join(page.figures["link"]["notes"])
    assert len(page.figures["occupancy"]["svgs"]) == 1 and len(page.figures["latency"]["svgs"]) == 1
    assert_shared_time_axis(page, ("occupancy", "ranks"))


# --------------------------------------------------------------------------- in a real browser

def chromium() -> str | None:
    for name in ("chromium-headless-shell", "chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def test_chromium_renders_the_sample_report(sample_report, tmp_path):
    browser = chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set but Chromium is not installed (dev.sh installs chromium-headless-shell)")
        pytest.skip("Chromium is not installed (apt-get install chromium-headless-shell, or ./dev.sh setup)")
    from PIL import Image
    import numpy as np
    _, text, _ = sample_report
    page = tmp_path / "report.html"
    page.write_text(text, encoding="utf-8")
    shot = tmp_path / "report.png"
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1400,4000",
           page.as_uri()]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    px = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert px.shape[:2] == (4000, 1400)
    # not blank
    ink = px.min(axis=2) < 200
    assert ink.mean() > 0.01
    # the verdict banner's colour (critical: #b71c1c) near the top
    banner = (np.abs(px[:300] - (0xB7, 0x1C, 0x1C)).sum(axis=2) < 30).sum()
    assert banner > 20_000, banner
    # the plots: many coloured (neither white nor grey) pixels spread over many lines of the page,
    # the write bars of the rank timeline (#1f77b4) most of all
    coloured = (px.max(axis=2) - px.min(axis=2)) > 60
    coloured[:300] = False                             # not the banner
    assert coloured.sum() > 60_000, coloured.sum()
    assert coloured.any(axis=1).sum() > 600
    writes = (np.abs(px - (0x1F, 0x77, 0xB4)).sum(axis=2) < 30).sum()
    assert writes > 20_000, writes
