"""``dsh sessions export --html`` (issue 28): one self-contained page of a session, opened in a
real headless Chromium (Debian's ``chromium``; skipped with a reason when it is not there).

The browser tests load the page from a file with ``--dump-dom``: the DOM after the page's own
script ran (it marks ``<html data-ready="1">``), so a hostile payload that executed would show
in it. The property test renders hostile text in every field in-process and parses the result.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.cli import export_html
from dsh.core.messages import Attachment
from dsh.core.messages import Message
from dsh.core.messages import Reasoning
from dsh.core.messages import ToolCall
from dsh.core.messages import Usage
from dsh.ledger import events as ev
from dsh.ledger.serialize import dump_event
from tests import scenario

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser",
                                                         "google-chrome")) if p), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (apt-get install -y chromium; .ci/run does)")

HOSTILE = ('<script>document.documentElement.setAttribute("data-pwned","script")</script>'
           '<img src=x onerror="document.documentElement.setAttribute(\'data-pwned\',\'img\')">'
           '<a href="javascript:alert(1)">click</a></style><style>body{display:none}</style>'
           '"><svg onload="document.title=\'pwned\'"></svg>\x1b[31m'
           '<link rel=stylesheet href="http://127.0.0.1:9/x.css"><iframe src="https://x.test">')


class Tags(HTMLParser):
    """Every start tag with its attributes; the text of ``<title>``."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_title = tag == "title" and not self.of("svg")  # the page's, not an SVG's

    def handle_endtag(self, tag: str) -> None:
        self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data

    def of(self, tag: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.tags if t == tag]

    def with_class(self, cls: str) -> list[dict[str, str | None]]:
        return [a for _, a in self.tags if cls in (a.get("class") or "").split()]


def parse(text: str) -> Tags:
    p = Tags()
    p.feed(text)
    return p


def assert_inert(page: Tags) -> None:
    """Only the page's own script, style and links; no handler, no URL but fragments and
    ``data:image/…``; nothing that fetches."""
    assert len(page.of("script")) == 1 and len(page.of("style")) == 1
    for tag in ("iframe", "link", "object", "embed", "base", "form", "svg:script"):
        assert not page.of(tag), tag
    for tag, attrs in page.tags:
        assert not any(k.startswith("on") for k in attrs), (tag, attrs)
        assert "style" not in attrs, (tag, attrs)
        if tag == "a":
            assert (attrs.get("href") or "").startswith("#"), attrs
        if tag == "img":
            assert (attrs.get("src") or "").startswith(
                tuple(f"data:{t};base64," for t in export_html.IMAGE_TYPES)), attrs
    assert "data-pwned" not in {k for _, a in page.tags for k in a}


def chromium(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    home = Path(os.environ.get("TMPDIR", "/tmp"))
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--no-first-run", "--disable-extensions", "--mute-audio",
                           f"--user-data-dir={home / f'dsh-chromium-{os.getpid()}'}", *args],
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def dom(path: Path) -> Tags:
    proc = chromium("--dump-dom", path.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = parse(proc.stdout)
    html = page.of("html")
    assert html and html[0].get("data-ready") == "1", "the page's own script did not run"
    return page


def png(width: int = 4, height: int = 3) -> bytes:
    """A real, tiny PNG (red)."""
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2,
                                                                0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


# -- the scenario: a tool loop, a sub-agent, a compaction ---------------------------------------


@pytest.fixture(scope="module")
def scenario_page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path]:
    folder = tmp_path_factory.mktemp("scenario")
    scenario.make(folder)
    sid = scenario.run(folder)
    out = folder / "page.html"
    proc = scenario.dsh(folder, "sessions", "export", "--html", sid, "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and f"wrote {out}" in proc.stderr
    return folder, sid, out


def test_export_html_to_stdout_is_the_same_page(scenario_page: tuple[Path, str, Path]) -> None:
    folder, sid, out = scenario_page
    proc = scenario.dsh(folder, "sessions", "export", "--format", "html", sid)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == out.read_text()
    page = parse(proc.stdout)
    assert page.title == f"dsh session {sid}"
    # counts straight from the ledgers: 7 lead steps + 2 helper steps, 5 + 1 reads, 1 ask
    assert len(page.with_class("step")) == 9
    assert len(page.with_class("tool-call")) == 7
    assert len(page.with_class("subagent")) == 1
    assert len(page.with_class("compaction")) >= 1


@needs_chromium
def test_browser_dom_has_the_steps_tool_calls_and_chart(
        scenario_page: tuple[Path, str, Path]) -> None:
    _, sid, out = scenario_page
    page = dom(out)
    assert len(page.with_class("step")) == 9
    assert len(page.with_class("tool-call")) == 7
    assert len(page.with_class("session")) == 2  # the lead's and the helper's, nested
    assert len(page.with_class("compaction")) >= 1
    chart = page.with_class("chart")
    assert chart and page.of("svg")
    assert len(page.with_class("bar")) == len(scenario.LEAD_USAGE) + len(scenario.HELPER_USAGE)
    assert_inert(page)
    summary = out.read_text()
    total_in = sum(u[0] for u in scenario.LEAD_USAGE + scenario.HELPER_USAGE)
    assert f"{total_in} in / " in summary and "cost $" in summary


@needs_chromium
def test_browser_screenshot(scenario_page: tuple[Path, str, Path], tmp_path: Path) -> None:
    _, _, out = scenario_page
    shot = tmp_path / "shot.png"
    proc = chromium("--hide-scrollbars", "--window-size=1000,900", f"--screenshot={shot}",
                    out.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 5000  # not a blank page
    if os.environ.get("DSH_UPDATE_SCREENSHOT"):
        Path(__file__).parent.parent.joinpath("docs", "session-page.png").write_bytes(data)


# -- a hostile session ---------------------------------------------------------------------------


def hostile_session(folder: Path, big: int = 10 * 1024 * 1024) -> str:
    """A ledger written event by event: hostile text in every field, a 10 MB tool output, a
    real image, an SVG attachment with a script, reasoning with a signature."""
    from dsh.config.loader import config_from_dict
    from dsh.run.app import App

    store = App(config_from_dict({"autoload": False,
                                  "sessions_dir": str(folder / "sessions")})).store
    image = png()
    sha = store.put_attachment(image)
    svg = (b'<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)">'
           b"<script>alert(1)</script></svg>")
    svg_sha = store.put_attachment(svg)
    sid = "20260101-000000.000-hostile"
    h = HOSTILE
    items: list[ev.Event] = [
        ev.TurnStarted(turn=1, agent=h, model=h, system=h, parent=h),
        ev.StepStarted(turn=1, step=0),
        ev.UserMessage(text=h, source=h, attachments=(
            Attachment(sha256=sha, media_type="image/png", size=len(image), name=h),
            Attachment(sha256=svg_sha, media_type="image/svg+xml", size=len(svg), name=h))),
        ev.ContextInjected(text=h, source=h),
        ev.AssistantMessage(text=h, model=h, usage=Usage(input_tokens=5, output_tokens=7),
                            tool_calls=(ToolCall(id=h, name=h, arguments={h: h}),),
                            reasoning=(Reasoning(kind="thinking", provider="anthropic", text=h,
                                                 signature="SIGNATURE-" + "s" * 40),
                                       Reasoning(kind="redacted_thinking",
                                                 provider="anthropic", data="OPAQUE-DATA"))),
        ev.ToolCalled(call_id=h, name=h, arguments={h: h}, child_session=h),
        ev.ToolReturned(call_id=h, name=h, status=h, output=h + "y" * big),
        ev.StepEnded(turn=1, step=0),
        ev.ContextCompacted(start=0, end=2, messages=(Message(role="user", content=h),),
                            strategy=h, plugin=h, reason=h, summary_session=h),
        ev.PluginEvent(plugin="x", name="y", data={h: [h]}),
        ev.StepRejected(turn=1, step=1, reason=h, plugin=h, text=h),
        ev.TurnEnded(turn=1, outcome=h, reason=h),
    ]
    lines = [dump_event(e.__class__(**{**{a.name: getattr(e, a.name)
                                         for a in e.__attrs_attrs__ if a.init},
                                      "seq": i, "session": sid, "ts": "2026-01-01T00:00:00Z"}))
             for i, e in enumerate(items)]
    (folder / "sessions" / f"{sid}.jsonl").write_text("\n".join(lines) + "\n")
    return sid


@pytest.fixture(scope="module")
def hostile_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hostile")
    scenario.make(folder)
    sid = hostile_session(folder)
    out = folder / "hostile.html"
    proc = scenario.dsh(folder, "sessions", "export", "--html", sid, "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def test_hostile_page_is_small_inert_and_keeps_no_secret_bytes(hostile_page: Path) -> None:
    text = hostile_page.read_text()
    assert len(text) < 1024 * 1024, "a 10 MB output is cut, not copied into the page"
    assert "more characters not shown" in text
    page = parse(text)
    assert_inert(page)
    assert "SIGNATURE-" not in text and "OPAQUE-DATA" not in text
    assert "\x1b" not in text
    assert len(page.of("img")) == 1  # the PNG inline; the SVG only named
    assert "<svg xmlns" not in text


@needs_chromium
def test_hostile_page_executes_nothing_in_the_browser(hostile_page: Path) -> None:
    page = dom(hostile_page)  # returns: the page loaded and its own script ran
    assert_inert(page)
    assert page.title.startswith("dsh session")
    assert len(page.with_class("tool-call")) == 1


# -- property: any text, anywhere ------------------------------------------------------------------

TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=60) | st.sampled_from(
    [HOSTILE, "</pre>", "<!--", "]]>", "&lt;script&gt;", "\"'><", "javascript:alert(1)",
     "</style>", "<base href=//evil>"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXT, TEXT, TEXT, TEXT)
def test_any_text_in_any_field_stays_text(a: str, b: str, c: str, d: str) -> None:
    events = [ev.TurnStarted(turn=1, agent=a, model=b, system=c, parent=d),
              ev.StepStarted(turn=1, step=0), ev.UserMessage(text=a, source=b),
              ev.AssistantMessage(text=c, tool_calls=(ToolCall(id=d, name=a, arguments={b: c}),),
                                  reasoning=(Reasoning(kind=d, provider="x", text=a),)),
              ev.ToolCalled(call_id=d, name=a, arguments={b: c}, child_session=None),
              ev.ToolReturned(call_id=d, name=a, status=b, output=c),
              ev.ContextCompacted(start=0, end=1, messages=(Message(role=a, content=b),),
                                  strategy=c, reason=d, summary_session=a or None),
              ev.PluginEvent(plugin="p", name="n", data={a: b}),
              ev.TurnEnded(turn=1, outcome=c, reason=d)]
    text = export_html.render(a or "s", events)
    page = parse(text)
    assert_inert(page)
    structural = {t for t, _ in page.tags}
    assert structural <= {"html", "head", "script", "meta", "title", "style", "body", "header",
                          "h1", "h2", "code", "p", "button", "figure", "svg", "g", "rect",
                          "text", "main", "section", "div", "b", "pre", "details",
                          "summary", "span", "a", "br", "polyline", "line"}, structural


def test_script_hash_in_the_policy_is_the_scripts() -> None:
    import base64

    from dsh.cli.html_assets import SCRIPT

    text = export_html.render("s", [])
    digest = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in text and "default-src 'none'" in text
    assert f"<script>{SCRIPT}</script>" in text


def test_missing_sub_agent_session_is_named_not_fatal(tmp_path: Path) -> None:
    def children(sid: str) -> list[ev.Event]:
        raise OSError(f"no such session {sid}")

    text = export_html.render("s", [ev.ToolCalled(call_id="c", name="ask_x", child_session="gone")],
                              children=children)
    assert "cannot read it: no such session gone" in text


def test_unknown_session_is_an_error_on_stderr(tmp_path: Path) -> None:
    scenario.make(tmp_path)
    proc = scenario.dsh(tmp_path, "sessions", "export", "--html", "nope")
    assert proc.returncode != 0 and proc.stdout == ""
    assert "nope" in proc.stderr and proc.stderr.startswith("dsh: error:")


def test_large_session_chart_is_bucketed() -> None:
    events: list[ev.Event] = []
    for i in range(1000):
        events += [ev.StepStarted(turn=1, step=i),
                   ev.AssistantMessage(usage=Usage(input_tokens=i, output_tokens=1)),
                   ev.StepEnded(turn=1, step=i)]
    page = parse(export_html.render("s", events))
    assert len(page.with_class("step")) == 1000
    assert len(page.with_class("bar")) <= export_html.CHART_BARS


_scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text())


@settings(max_examples=400, deadline=None)
@given(value=st.one_of(st.dictionaries(st.text(), _scalar),
                       st.dictionaries(st.text(), st.lists(_scalar, max_size=3), max_size=3)))
def test_arguments_json_is_the_indented_dump_whatever_the_shape(value):
    """The flat-object fast path (the C encoder's pieces joined) writes exactly what
    ``json.dumps(indent=1, sort_keys=True)`` writes; other shapes take that call itself."""
    import json

    assert export_html._json(value) == json.dumps(value, ensure_ascii=False, indent=1,
                                                  sort_keys=True, default=str)
