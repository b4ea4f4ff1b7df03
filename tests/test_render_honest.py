"""``dsh sessions show`` and the HTML page say what happened: a tool call that never started
shows its arguments and ``not run (OUTCOME: REASON)`` (distinct from one interrupted while it
ran), a cut says what it hid in good grammar and only when it hides something worth it, the
sandbox record is one readable line, the page numbers steps as ``show`` does, counts in the
singular when there is one, and its chart has labelled axes.

The sessions are made by the real ``dsh`` in subprocesses (scripted model, ``-L`` limits,
the installed dsh-shell plugin); a few rendering details are checked on ledgers written
event by event.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dsh.cli import export_html
from dsh.cli.event_lines import more_note
from dsh.cli.event_lines import plural
from dsh.cli.render import markdown
from dsh.cli.render import trajectory
from dsh.core.messages import ToolCall
from dsh.core.messages import Usage
from dsh.ledger import events as ev
from dsh.ledger.writer import INTERRUPTED
from dsh.ledger.writer import Ledger
from tests.test_export_html import HOSTILE
from tests.test_export_html import assert_inert
from tests.test_export_html import parse


class Env:
    """A working directory, a dsh home and a config folder, apart (the sandbox refuses a
    workspace holding dsh's own files)."""

    def __init__(self, root: Path) -> None:
        self.work = root / "work"
        self.work.mkdir(parents=True)
        self.root = root
        self.env = {k: v for k, v in os.environ.items()
                    if not (k.startswith("DSH_") or k.endswith("_API_KEY"))}
        self.env.update(DSH_HOME=str(root / "home"), XDG_CONFIG_HOME=str(root / "xdg"),
                        DSH_LOAD_PLUGINS="shell")
        self.n = 0

    def script(self, *responses: dict[str, Any]) -> str:
        self.n += 1
        path = self.root / f"script{self.n}.json"
        path.write_text(json.dumps({"responses": list(responses)}))
        return f"scripted:{path}"

    def dsh(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dsh", *args], cwd=self.work,
                              capture_output=True, text=True, timeout=180, env=self.env,
                              stdin=subprocess.DEVNULL)

    def run(self, model: str, *args: str, code: int = 0) -> str:
        proc = self.dsh("run", "-m", model, "--json", *args, "go")
        assert proc.returncode == code, proc.stderr
        return str(json.loads(proc.stdout)["session"])

    def show(self, sid: str) -> str:
        proc = self.dsh("sessions", "show", sid)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def page(self, sid: str) -> str:
        proc = self.dsh("sessions", "export", "--html", sid)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout


def reply(*calls: tuple[str, dict[str, Any]], text: str = "") -> dict[str, Any]:
    return {"text": text, "tool_calls": [{"name": n, "arguments": a} for n, a in calls],
            "usage": {"input_tokens": 10, "output_tokens": 3}}


def tool_calls(page: str) -> list[str]:
    """Each tool call box of the page as text (tags dropped)."""
    boxes = re.findall(r'<div class="ev tool-call[^"]*".*?</div>', page, re.S)
    return [re.sub(r"<[^>]+>", "", b) for b in boxes]


# -- calls that never started ----------------------------------------------------------------


def test_budget_stop_after_the_answer_shows_the_call_as_not_run(tmp_path: Path) -> None:
    """``-L requests=1``: the model's one answer asks for a tool, the budget is spent, the
    call never starts (no ``tool/call`` in the ledger): its arguments and ``not run``."""
    env = Env(tmp_path)
    model = env.script(reply(("list_dir", {"path": "src"}), text="looking"), {"text": "x"})
    sid = env.run(model, "-L", "requests=1", code=3)
    lines = env.show(sid).splitlines()
    assert '  → list_dir {"path": "src"}' in lines
    at = lines.index('  → list_dir {"path": "src"}')
    assert lines[at + 1] == "TOOL list_dir not run (budget: model requests limit reached (1/1))"
    assert not lines[at + 2].startswith("  ")  # no "interrupted: the run ended…" body
    assert "interrupted" not in "\n".join(lines)
    page = env.page(sid)
    [box] = tool_calls(page)
    assert "tool list_dir" in box and "not run (budget: model requests limit reached (1/1))" in box
    assert "&quot;path&quot;: &quot;src&quot;" in box  # the arguments as the model asked
    assert "1 turn · 1 step · 1 tool call · 1 model response · " in page
    assert_inert(parse(page))


def test_a_call_refused_by_the_tool_call_limit_says_not_run(tmp_path: Path) -> None:
    """``-L tool_calls=1`` and two calls in one answer: the first runs, the second could not
    reserve its place and never started."""
    env = Env(tmp_path)
    (env.work / "a.txt").write_text("a\n")
    model = env.script(reply(("list_dir", {"path": "."}), ("list_dir", {"path": "sub"})),
                       {"text": "x"})
    sid = env.run(model, "-L", "tool_calls=1", code=3)
    text = env.show(sid)
    assert '  → list_dir {"path": "."}' in text and '  → list_dir {"path": "sub"}' in text
    assert re.search(r"^TOOL list_dir ok · \d+ ms$", text, re.M), text
    lines = text.splitlines()
    at = lines.index("TOOL list_dir not run (budget: tool calls limit reached (1/1))")
    assert not lines[at + 1].startswith("  not run")  # said once, in the header
    page = env.page(sid)
    boxes = tool_calls(page)
    assert len(boxes) == 2 and "not run (budget: tool calls limit reached (1/1))" in boxes[1]
    assert "not run" not in boxes[0]
    assert "2 tool calls" in page


def _session(*items: ev.Event) -> list[ev.Event]:
    seen: list[ev.Event] = []
    led = Ledger("s")
    led.observer = seen.append
    for item in items:
        fields = {a.name: getattr(item, a.name) for a in item.__attrs_attrs__
                  if a.init and a.name not in ("seq", "ts", "session", "v")}
        led.append(type(item), **fields)
    return seen


def test_started_and_interrupted_is_distinct_from_never_started() -> None:
    calls = (ToolCall(id="c1", name="grep", arguments={"pattern": "x"}),
             ToolCall(id="c2", name="grep", arguments={"pattern": "y"}))
    started = _session(
        ev.TurnStarted(turn=1, agent="a"), ev.StepStarted(turn=1, step=0),
        ev.AssistantMessage(tool_calls=calls[:1]),
        ev.ToolCalled(call_id="c1", name="grep", arguments={"pattern": "x"}),
        ev.ToolReturned(call_id="c1", name="grep", status="interrupted", output=INTERRUPTED),
        ev.TurnEnded(turn=1, outcome="aborted", reason="interrupted"))
    text = trajectory(started)
    assert "TOOL grep interrupted\n  " + INTERRUPTED in text and "not run" not in text
    never = _session(
        ev.TurnStarted(turn=1, agent="a"), ev.StepStarted(turn=1, step=0),
        ev.AssistantMessage(tool_calls=calls),
        ev.ToolReturned(call_id="c1", name="grep", status="interrupted", output=INTERRUPTED),
        ev.ToolReturned(call_id="c2", name="grep", status="interrupted", output=INTERRUPTED),
        ev.TurnEnded(turn=1, outcome="aborted", reason="SIGTERM"))
    text = trajectory(never)
    assert text.count("TOOL grep not run (aborted: SIGTERM)") == 2
    assert '  → grep {"pattern": "x"}' in text and '  → grep {"pattern": "y"}' in text
    assert INTERRUPTED not in text
    page = export_html.render("s", never)
    assert len(tool_calls(page)) == 2 and page.count("not run (aborted: SIGTERM)") == 2
    md = markdown("s", never)
    assert md.count("**Tool result** `grep` (not run (aborted: SIGTERM))") == 2
    assert '**Tool call** `grep`\n\n```json\n{\n  "pattern": "y"\n}\n```' in md


def test_not_run_reasons_and_arguments_stay_escaped() -> None:
    items = _session(
        ev.TurnStarted(turn=1, agent="a"), ev.StepStarted(turn=1, step=0),
        ev.AssistantMessage(tool_calls=(ToolCall(id="c", name="t", arguments={"q": HOSTILE}),)),
        ev.ToolReturned(call_id="c", name="t", status="interrupted", output=INTERRUPTED),
        ev.TurnEnded(turn=1, outcome="budget", reason=HOSTILE))
    assert_inert(parse(export_html.render("s", items)))
    shown = trajectory(items, terminal=True)
    assert "\x1b[31m" not in shown and "not run (budget: " in shown


# -- cuts ----------------------------------------------------------------------------------------


def _output(text: str) -> list[ev.Event]:
    return _session(ev.ToolReturned(call_id="c", name="cat", output=text))


def test_a_cut_is_grammatical_and_only_when_worth_it() -> None:
    assert plural(1, "tool call") == "1 tool call" and plural(2, "tool call") == "2 tool calls"
    assert more_note(1, 1) == "1 more line, 1 more character"
    assert more_note(0, 250) == "250 more characters"
    # 13 short lines: the 13th is shown, not replaced by a note ("1 more lines")
    thirteen = "\n".join(f"row {i}" for i in range(13))
    assert trajectory(_output(thirteen)).count("row ") == 13
    assert "more" not in trajectory(_output(thirteen))
    # one line just over the character cap: shown whole ("0 more lines, 100 more…" before)
    assert "more" not in trajectory(_output("y" * 2100))
    text = trajectory(_output("y" * 2500))
    assert text.endswith("… (500 more characters; --full)\n") and "more lines" not in text
    # one long line left over: "1 more line"
    rest = "\n".join(["s"] * 12 + ["z" * 300])
    assert trajectory(_output(rest)).endswith("… (1 more line, 301 more characters; --full)\n")
    many = "\n".join(f"row {i}" for i in range(100))
    assert "… (88 more lines, " in trajectory(_output(many))


# -- plugin events -------------------------------------------------------------------------------

SANDBOX = {"call_id": "call_0_0", "tool": "run_command", "policy": "workspace-write",
           "network": False, "read": [], "write": [], "workspace": "/w",
           "namespaces": ["user", "mount", "pid"], "read_only": [], "backend": "landlock",
           "abi": 7}
SANDBOX_LINE = ("sandbox of call_0_0 (run_command): workspace-write, no network in /w — "
                "landlock ABI 7, namespaces user+mount+pid")


def test_plugin_events_are_one_line_in_the_page() -> None:
    items = _session(ev.PluginEvent(plugin="shell", name="sandbox", data=SANDBOX),
                     ev.PluginEvent(plugin="acme", name="count", data={"n": 3, "k": "v"}),
                     ev.PluginEvent(plugin="acme", name="said", data={"summary": "two\nlines"}))
    page = export_html.render("s", items)
    boxes = re.findall(r'<div class="ev plugin".*?</div>', page, re.S)
    assert len(boxes) == 3 and all("\n" not in b and "<pre" not in b for b in boxes)
    assert SANDBOX_LINE in boxes[0] and "&quot;policy&quot;" not in boxes[0]
    assert "<code class=\"data\">{&quot;n&quot;:3,&quot;k&quot;:&quot;v&quot;}</code>" in boxes[1]
    assert "two lines" in boxes[2]
    assert f"⛨ {SANDBOX_LINE}" in trajectory(items)


def test_hostile_plugin_lines_stay_text() -> None:
    items = _session(
        ev.PluginEvent(plugin="shell", name="sandbox", data={**SANDBOX, "workspace": HOSTILE}),
        ev.PluginEvent(plugin="acme", name="said", data={"summary": HOSTILE}),
        ev.PluginEvent(plugin="dsh.tools", name="approval",
                       data={"tool": HOSTILE, "subject": HOSTILE, "allowed": False}))
    page = export_html.render("s", items)
    assert_inert(parse(page))
    assert page.count('<span class="line">') == 3  # each a readable line, escaped
    shown = trajectory(items, terminal=True)
    assert "\x1b[31m" not in shown and shown.count("\n") == 3


def test_sandbox_and_approval_records_of_a_real_run(tmp_path: Path) -> None:
    env = Env(tmp_path)
    model = env.script(reply(("run_command", {"command": "echo hi"})), {"text": "done"})
    sid = env.run(model)
    ledger = [json.loads(line) for line in
              next((tmp_path / "home" / "sessions").glob(f"{sid}.jsonl")).read_text()
              .splitlines()]
    if not any(e["type"] == "x/shell/sandbox" for e in ledger):
        pytest.skip("no sandbox record: this machine ran the command without dsh-shell's "
                    "sandbox")
    text = env.show(sid)
    [line] = [x for x in text.splitlines() if "sandbox of call_0_0" in x]
    assert line.startswith("  ⛨ sandbox of call_0_0 (run_command): ") and "{" not in line
    assert "  ◆ approval: run_command `echo hi` (read) allowed by mode" in text
    page = env.page(sid)
    [box] = re.findall(r'<div class="ev plugin"[^>]*title="x/shell/sandbox v1".*?</div>',
                       page, re.S)
    assert line.strip().removeprefix("⛨ ") in box and "&quot;" not in box


# -- the page: step numbers, counts, the chart ---------------------------------------------


def test_page_numbers_steps_as_show_does(tmp_path: Path) -> None:
    env = Env(tmp_path)
    model = env.script(reply(("list_dir", {"path": "."})), reply(("list_dir", {"path": "."})),
                       {"text": "done", "usage": {"input_tokens": 30, "output_tokens": 2}})
    sid = env.run(model)
    shown = [1] + [int(n) for n in re.findall(r"^· step (\d+)$", env.show(sid), re.M)]
    page = env.page(sid)
    paged = [int(n) for n in re.findall(r'<div class="step-h">step (\d+)</div>', page)]
    assert shown == paged == [1, 2, 3]
    assert "1 turn · 3 steps · 2 tool calls · 3 model responses · " in page
    assert "0 compactions · 0 sub-agent runs" in page


def test_chart_has_labelled_axes() -> None:
    items: list[ev.Event] = [ev.TurnStarted(turn=1, agent="a", model="m")]
    for i, (inp, out) in enumerate([(120, 30), (340, 12), (80, 5)]):
        items += [ev.StepStarted(turn=1, step=i),
                  ev.AssistantMessage(usage=Usage(input_tokens=inp, output_tokens=out)),
                  ev.StepEnded(turn=1, step=i)]
    page = export_html.render("s", items)
    svg = re.search(r"<svg.*?</svg>", page, re.S)
    assert svg is not None
    chart = svg.group(0)
    titles = re.findall(r'<text class="axis-title"[^>]*>([^<]*)</text>', chart)
    assert titles == ["tokens per response", "model response (in page order, sub-agents' "
                                             "included)"]
    ticks = re.findall(r'<text class="tick"[^>]*>([^<]*)</text>', chart)
    assert ticks == ["0", "250", "500", "1", "3"]  # the token axis up to 500, responses 1…3
    assert chart.count('<line class="axis"') == 2
    priced = export_html.render("s", items, price=lambda model: (3.0, 15.0))
    chart = re.search(r"<svg.*?</svg>", priced, re.S).group(0)  # type: ignore[union-attr]
    assert "cost per response (USD)" in chart and chart.count('<line class="axis"') == 3
    assert ">$0.0012<" in chart  # the dearest response: 340 × 3 + 12 × 15 per million
