"""A run's own asker (``Session.send(asker=...)``, ``RunContext.asker``) answers the approval
questions in place of the terminal: what an editor's permission dialog over ACP, or a server
with no one to ask, plugs in. What the mode decides never reaches it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dsh

pytest.importorskip("dsh_shell")

WRITE = {"tool_calls": [{"name": "write_file", "arguments": {"path": "notes.txt",
                                                             "content": "changed"}}]}


def _app(tmp_path: Path, ws: Path) -> dsh.App:
    return dsh.App.from_config({"sessions_dir": str(tmp_path / "sessions"),
                                "plugins": {"shell": {"workspace": str(ws)}}})


@pytest.mark.parametrize("allowed", [True, False])
def test_the_asker_answers_what_the_mode_leaves_open(
        tmp_path: Path, script: Callable[..., str], allowed: bool) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("mine\n")
    asked: list[Any] = []

    def asker(ask: Any) -> Any:
        asked.append(ask)
        return dsh.Decision(allowed, "editor", "the editor's dialog said so")

    app = _app(tmp_path, ws)
    with app.session(model=script(WRITE, {"text": "done"})) as s:
        result = s.send("write it", asker=asker)
    assert [(a.tool, a.action, a.subject) for a in asked] == [("write_file", "write",
                                                                "notes.txt")]
    assert (ws / "notes.txt").read_text() == ("changed" if allowed else "mine\n")
    events = [json.loads(line) for line in Path(result.path).read_text().splitlines()]
    [decision] = [e["data"] for e in events if e["type"] == "x/dsh.tools/approval"]
    assert (decision["allowed"], decision["by"]) == (allowed, "editor")


def test_a_failing_asker_is_a_no_and_the_mode_is_never_asked(
        tmp_path: Path, script: Callable[..., str]) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("mine\n")

    def broken(ask: Any) -> Any:
        raise RuntimeError("dialog closed")

    app = _app(tmp_path, ws)
    with app.session(model=script(WRITE, {"text": "done"})) as s:
        s.send("write it", asker=broken)
    assert (ws / "notes.txt").read_text() == "mine\n"
    called: list[Any] = []
    with app.session(model=script(WRITE, {"text": "done"}), mode="read-only") as s:
        result = s.send("write it", asker=called.append)
    assert called == [] and (ws / "notes.txt").read_text() == "mine\n"
    events = [json.loads(line) for line in Path(result.path).read_text().splitlines()]
    [decision] = [e["data"] for e in events if e["type"] == "x/dsh.tools/approval"]
    assert decision["by"] == "mode" and not decision["allowed"]


@pytest.mark.parametrize(("why", "mode", "allowed"), [
    ("the editor approved it; mode auto-edit", "auto-edit", True),
    ("the editor approved it", "ask", True),
    ("the editor said no", "plan", False),
])
def test_a_plan_is_approved_by_the_asker_never_on_the_terminal(
        tmp_path: Path, script: Callable[..., str], why: str, mode: str, allowed: bool) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    asked: list[Any] = []

    def asker(ask: Any) -> Any:
        asked.append(ask)
        return dsh.Decision(allowed, "editor", why)

    plan = {"tool_calls": [{"name": "propose_plan", "arguments": {"plan": "1. edit notes"}}]}
    app = _app(tmp_path, ws)
    with app.session(model=script(plan, {"text": "ok"}), mode="plan") as s:
        s.send("plan it", asker=asker)
        assert s.planned_mode == (mode if allowed else None)
    [ask] = asked
    assert (ask.tool, ask.action, ask.detail) == ("propose_plan", "plan", "1. edit notes")
