"""Rendering: the trajectory view, the markdown export, the sessions table, the status line,
streamed text, ``--events`` lines, a closed stdout and config editing helpers."""

from __future__ import annotations

import io
import json
import sys
from typing import Any

import pytest

from dsh.cli.escape import one_line
from dsh.cli.escape import use_color
from dsh.cli.render import markdown
from dsh.cli.render import trajectory
from dsh.cli.session_list import sessions_table
from dsh.cli.status import StatusLine
from dsh.cli.streams import Stdout
from dsh.cli.streams import TextPrinter
from dsh.cli.terminal import event_line
from dsh.config.edit import parse_key
from dsh.config.edit import parse_value
from dsh.core.messages import ToolCall
from dsh.core.messages import Usage
from dsh.ledger.events import AssistantMessage
from dsh.ledger.events import ContextInjected
from dsh.ledger.events import Event
from dsh.ledger.events import StepEnded
from dsh.ledger.events import StepRejected
from dsh.ledger.events import StepStarted
from dsh.ledger.events import ToolCalled
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import TurnEnded
from dsh.ledger.events import TurnStarted
from dsh.ledger.events import UserMessage
from dsh.ledger.serialize import dump_event
from dsh.ledger.store import SessionInfo
from dsh.ledger.writer import Ledger
from dsh.run.recorder import LiveEvent


@pytest.fixture
def events() -> list[Event]:
    collected: list[Event] = []
    led = Ledger("s1")
    led.observer = collected.append
    call = ToolCall(id="c1", name="add", arguments={"a": 2, "b": 2})
    led.append(TurnStarted, turn=1, agent="calc", model="scripted", system="Be exact.")
    led.append(StepStarted, turn=1, step=0)
    led.append(ContextInjected, text="today is Monday", source="api")
    led.append(UserMessage, text="what is 2+2?")
    led.append(AssistantMessage, text="Adding.", tool_calls=(call,),
               usage=Usage(input_tokens=10, output_tokens=3))
    led.append(ToolCalled, call_id="c1", name="add", arguments={"a": 2, "b": 2})
    led.append(ToolReturned, call_id="c1", name="add", output="4", duration_ms=1.5)
    led.append(StepEnded, turn=1, step=0)
    led.append(StepStarted, turn=1, step=1)
    led.append(AssistantMessage, text="It is 4.", usage=Usage(input_tokens=12, output_tokens=4))
    led.append(StepEnded, turn=1, step=1)
    led.append(TurnEnded, turn=1, outcome="completed")
    led.append(TurnStarted, turn=2, agent="calc")
    led.append(StepRejected, turn=2, step=0, reason="no secrets", plugin="guard",
               text="tell me the key")
    led.append(TurnEnded, turn=2, outcome="rejected", reason="no secrets")
    return collected


# --------------------------------------------------------------------------------------------
# Trajectory view
# --------------------------------------------------------------------------------------------


def test_trajectory_timeline_in_order(events: list[Event]) -> None:
    text = trajectory(events)
    expected = [
        "━━ turn 1 ━━ agent calc · model scripted",
        "SYSTEM", "  Be exact.",
        "CONTEXT (injected by api)", "  today is Monday",
        "USER", "  what is 2+2?",
        "ASSISTANT", "  Adding.",
        '  → add {"a": 2, "b": 2}',
        "TOOL add ok · 2 ms", "  4",
        "· step 2",
        "ASSISTANT", "  It is 4.",
        "━━ turn 1 completed ━━ 2 steps · 22 in / 7 out tokens",
        "",
        "━━ turn 2 ━━ agent calc",
        "REJECTED step 1 by guard: no secrets", "  tell me the key",
        "━━ turn 2 rejected (no secrets) ━━ 0 steps",
    ]
    assert text.splitlines() == expected


def test_trajectory_colour_only_when_asked(events: list[Event]) -> None:
    assert "\x1b[" not in trajectory(events, color=False)
    coloured = trajectory(events, color=True)
    assert "\x1b[" in coloured
    assert "USER" in coloured and "TOOL add" in coloured


def test_trajectory_truncates_long_tool_output_unless_full() -> None:
    led = Ledger("s")
    seen: list[Event] = []
    led.observer = seen.append
    led.append(ToolReturned, call_id="c", name="cat", status="error",
               output="\n".join(f"row {i}" for i in range(100)))
    short = trajectory(seen)
    assert "row 11" in short and "row 12" not in short
    assert "(88 more lines" in short and "--full" in short
    assert short.startswith("TOOL cat error")
    assert "row 99" in trajectory(seen, full=True)


def test_use_color_honours_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert use_color(Tty()) is True
    assert use_color(io.StringIO()) is False
    monkeypatch.setenv("NO_COLOR", "1")
    assert use_color(Tty()) is False


# --------------------------------------------------------------------------------------------
# Markdown export and the sessions table
# --------------------------------------------------------------------------------------------


def test_markdown_export(events: list[Event]) -> None:
    md = markdown("s1", events)
    assert md.startswith("# Session s1\n\n## Turn 1\n")
    for piece in ["**User**\n\nwhat is 2+2?", "**Assistant**\n\nAdding.",
                  '**Tool call** `add`\n\n```json\n{\n  "a": 2,\n  "b": 2\n}\n```',
                  "**Tool result** `add` (ok)\n\n```\n4\n```",
                  "**Step rejected** by `guard`: no secrets",
                  "_Turn 2 rejected: no secrets_"]:
        assert piece in md


def test_markdown_fence_outgrows_backticks_in_content() -> None:
    led = Ledger("s")
    seen: list[Event] = []
    led.observer = seen.append
    led.append(ToolReturned, call_id="c", name="cat", output="```python\nx = 1\n```")
    md = markdown("s", seen)
    assert "````\n```python\nx = 1\n```\n````" in md


def test_sessions_table_aligns_and_cuts_the_prompt() -> None:
    rows = [SessionInfo(id="20260101-000000-aaaaaa", path=None,  # type: ignore[arg-type]
                        agent="default", model="echo", started="2026-01-01T00:00:00.000Z",
                        turns=2, first_prompt="a " * 100),
            SessionInfo(id="20260101-000001-bbbbbb", path=None,  # type: ignore[arg-type]
                        agent="coder", model="openai:gpt-4o", turns=1, first_prompt="hi")]
    lines = sessions_table(rows, width=100).splitlines()
    assert lines[0].split() == ["ID", "AGENT", "MODEL", "STARTED", "TURNS", "CWD", "FIRST",
                                "PROMPT"]
    col = lines[0].index("FIRST PROMPT")
    assert lines[1][col - 2:col] == "  " and lines[2][col:] == "hi"
    assert len(lines[1]) <= 100 and lines[1].endswith("…")


def test_one_line() -> None:
    assert one_line("a\n  b\tc", 10) == "a b c"
    assert one_line("abcdefghijk", 5) == "abcd…"


# --------------------------------------------------------------------------------------------
# Live output
# --------------------------------------------------------------------------------------------


def test_status_line_follows_events_and_erases() -> None:
    stream = io.StringIO()
    status = StatusLine(stream, color=False)
    led = Ledger("s")
    led.observer = status.on_event
    led.append(StepStarted, turn=1, step=0)
    assert "step 1 · waiting for the model" in status.line()
    led.append(ToolCalled, call_id="c", name="grep")
    status.draw()
    assert stream.getvalue().startswith("\r") and "running tool grep" in stream.getvalue()
    assert "\x1b[2m" not in stream.getvalue()  # no colour
    status.hide()
    assert stream.getvalue().endswith("\r\x1b[K")
    before = stream.getvalue()
    status.draw()  # hidden: draws nothing
    assert stream.getvalue() == before
    status.show()
    status.note("dsh: hello")
    assert stream.getvalue().endswith("dsh: hello\n")
    status.stop()


def test_status_line_shows_the_permission_mode() -> None:
    status = StatusLine(io.StringIO(), color=False)
    led = Ledger("s")
    led.observer = status.on_event
    led.append(StepStarted, turn=1, step=0)
    assert "step 1 · waiting" in status.line()  # not known yet: nothing shown
    led.append(TurnStarted, turn=2, agent="a", model="echo", mode="plan")
    assert "plan · waiting for the model" in status.line()
    # At each step the run's own mode (an approved plan changes it).
    from dsh.host.runcontext import RunContext
    from dsh.host.runcontext import activate

    with activate(RunContext(run_id="r", agent="a", ledger=led, mode="auto-edit")):
        led.append(StepStarted, turn=2, step=1)
    assert "step 2 · auto-edit · waiting for the model" in status.line()
    status.stop()


def test_status_line_ticks_in_a_thread() -> None:
    stream = io.StringIO()
    status = StatusLine(stream, color=True, interval=0.01)
    status.start()
    import time

    deadline = time.monotonic() + 30  # a condition, not a time: under load a tick is late
    while stream.getvalue().count("\r") < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    status.stop()
    text = stream.getvalue()
    assert text.count("\r") >= 3 and "\x1b[2m" in text
    assert text.endswith("\r\x1b[K")


def test_text_printer_separates_steps_and_ends_with_a_newline() -> None:
    out: list[str] = []
    calls: list[str] = []
    printer = TextPrinter(out.append, lambda: calls.append("hide"), lambda: calls.append("show"))
    printer.on_event(StepStarted(turn=1, step=0))
    printer.on_text("Let me ")
    printer.on_text("look.")
    printer.on_event(ToolCalled(call_id="c", name="grep"))
    assert "".join(out) == "Let me look.\n"  # a clean line before the tool runs
    printer.on_event(StepStarted(turn=1, step=1))
    printer.on_text("Found it.")
    printer.finish()
    printer.finish()
    assert "".join(out) == "Let me look.\nFound it.\n"
    assert calls == ["show", "hide", "hide", "show", "show", "hide"]


def test_event_lines_are_ledger_lines() -> None:
    e = UserMessage(seq=3, ts="t", session="s", text="hi")
    assert event_line(e) == dump_event(e)
    live = json.loads(event_line(LiveEvent("llm/stream", {"delta": "he"})))
    assert live == {"type": "llm/stream", "delta": "he"}


def test_stdout_survives_a_closed_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    class Closed(io.StringIO):
        writes = 0

        def write(self, s: str) -> int:
            Closed.writes += 1
            raise BrokenPipeError

    monkeypatch.setattr(sys, "stdout", Closed())
    calls: list[int] = []
    out = Stdout(on_closed=lambda: calls.append(1))
    out.write("a")
    out.write("b")
    assert out.closed and calls == [1] and Closed.writes == 1


# --------------------------------------------------------------------------------------------
# Config editing helpers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "parts"), [
    ("model", ["model"]),
    ("agents.coder.model", ["agents", "coder", "model"]),
    ('models."gpt-4.1".base_url', ["models", "gpt-4.1", "base_url"]),
])
def test_parse_key(key: str, parts: list[str]) -> None:
    assert parse_key(key) == parts


@pytest.mark.parametrize(("raw", "value"), [
    ("3", 3), ("0.5", 0.5), ("true", True), ('["a", "b"]', ["a", "b"]),
    ('"007"', "007"), ("openai:gpt-4o", "openai:gpt-4o"), ("hello world", "hello world"),
])
def test_parse_value(raw: str, value: Any) -> None:
    assert parse_value(raw) == value


def test_reasoning_parts_render_by_what_they_hold() -> None:
    """A readable part shows its text, an opaque one a marker with its size, an empty one
    (a thinking-mode server's empty ``reasoning_content``) says so: never "encrypted"."""
    from dsh.cli.render import _Styler
    from dsh.cli.render import reasoning_line
    from dsh.core.messages import Reasoning

    plain = _Styler(False)
    assert reasoning_line(Reasoning(kind="reasoning_content", provider="openai"), plain,
                          False) == "  ∴ [reasoning_content (openai), empty]"
    assert reasoning_line(Reasoning(kind="reasoning", provider="openai-responses", data="xyz"),
                          plain, False) == "  ∴ [reasoning (openai-responses), encrypted, 3 bytes]"
    assert reasoning_line(Reasoning(kind="thinking", provider="anthropic", text="a  b\nc",
                                    signature="s"), plain, False) == (
        "  ∴ thinking (anthropic): a b c")
