"""The agent loop: the flow of B2, the inbox (B3), pre_step (B4), limits, turn_stopping."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dsh.hookspecs import hookimpl
from dsh.ledger.serialize import load_event
from dsh.ledger.store import JsonlStore
from tests.conftest import ledger_types


def add(a: int, b: int) -> int:
    """Add two integers.

    :param a: the first
    :param b: the second
    """
    return a + b


@hookimpl
def register_tools(register):  # type: ignore[no-untyped-def]
    register(add)


TWO_STEP = (
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
    {"text": "the sum is 5"},
)


def test_two_step_tool_loop_writes_exact_events(make_app, plugin_module, script):
    app = make_app(load=[plugin_module(register_tools=register_tools)])
    result = app.run("add 2 and 3", model=script(*TWO_STEP))
    assert result.outcome == "completed", result.reason
    assert result.output == "the sum is 5"
    assert result.steps == 2
    assert ledger_types(result.path) == [
        "turn/start", "step/start", "user/message", "assistant/message", "tool/call",
        "tool/result", "step/end", "step/start", "assistant/message", "step/end", "turn/end",
    ]
    lines = [json.loads(x) for x in result.path.read_text().splitlines()]
    assert [x["seq"] for x in lines] == list(range(11))
    assert {x["session"] for x in lines} == {result.session_id}
    assert all(x["v"] == 1 and x["ts"].endswith("Z") for x in lines)
    assert lines[5]["output"] == "5" and lines[5]["status"] == "ok"
    assert lines[3]["tool_call_source"] == "native"
    assert lines[0]["tools"][0]["name"] == "add"


def test_second_process_derives_identical_messages(make_app, plugin_module, script, tmp_path):
    app = make_app(load=[plugin_module(register_tools=register_tools)])
    result = app.run("add 2 and 3", model=script(*TWO_STEP))
    with app.store.open(result.session_id) as ledger:
        in_process = list(ledger.projection.view())
    code = textwrap.dedent(f"""
        import json, attrs
        from pathlib import Path
        from dsh.ledger.store import JsonlStore
        store = JsonlStore(Path({str(result.path.parent)!r}))
        with store.open({result.session_id!r}) as ledger:
            print(json.dumps([attrs.asdict(m) for m in ledger.projection.view()]))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    import attrs

    expected = json.loads(json.dumps([attrs.asdict(m) for m in in_process]))
    assert json.loads(out.stdout) == expected
    assert [m.role for m in in_process] == ["user", "assistant", "tool", "assistant"]


def test_resume_continues_session(make_app, script):
    app = make_app()
    model = script({"text": "one"}, {"text": "two"})
    first = app.run("hi", model=model)
    second = app.run("again", model=model, session=first.session_id)
    assert second.output == "two"  # the script position follows the ledger's history
    events = app.store.read(first.session_id)
    assert [e.turn for e in events if e.type == "turn/start"] == [1, 2]  # type: ignore[attr-defined]
    starts = [e for e in events if e.type == "turn/start"]
    assert starts[1].model is None  # unchanged since turn 1: not repeated


def test_inbox_injected_context_waits_for_user_message(make_app):
    app = make_app()
    with app.session(model="echo") as s:
        s.inject("the build is green", source="ci")
        assert s.ledger.projection.seq == -1  # injecting alone starts nothing (B3)
        result = s.send("status?")
    types = ledger_types(result.path)
    assert types[:4] == ["turn/start", "step/start", "context/injected", "user/message"]
    events = app.store.read(result.session_id)
    injected = [e for e in events if e.type == "context/injected"][0]
    assert injected.text == "the build is green" and injected.source == "ci"  # type: ignore[attr-defined]
    with app.store.open(result.session_id) as ledger:
        msgs = list(ledger.projection.view())
    assert "the build is green" in msgs[0].content and msgs[1].content == "status?"


class Rejecter:
    @hookimpl
    def pre_step(self, step):  # type: ignore[no-untyped-def]
        if "secret" in step.text:
            step.reject("prompt mentions a secret")


def test_pre_step_rejection_closes_turn_and_logs(make_app, plugin_module):
    guard = plugin_module(pre_step=Rejecter().pre_step)
    app = make_app(load=[guard])
    result = app.run("tell me the secret", model="echo")
    assert result.outcome == "rejected"
    assert result.reason == "prompt mentions a secret"
    assert ledger_types(result.path) == ["turn/start", "step/rejected", "turn/end"]
    rejected = app.store.read(result.session_id)[1]
    assert rejected.text == "tell me the secret" and rejected.plugin == guard  # type: ignore[attr-defined]
    # a rejected step never reaches the history
    with app.store.open(result.session_id) as ledger:
        assert len(ledger.projection) == 0


def test_pre_step_rewrite_is_what_gets_logged(make_app, plugin_module):
    @hookimpl
    def pre_step(step):  # type: ignore[no-untyped-def]
        step.text = step.text.replace("password123", "[redacted]")

    app = make_app(load=[plugin_module(pre_step=pre_step)])
    result = app.run("my password123 is", model="echo")
    assert result.output == "my [redacted] is"
    assert "password123" not in result.path.read_text()


def test_pre_step_rewrite_to_empty_is_rejection(make_app, plugin_module):
    @hookimpl
    def pre_step(step):  # type: ignore[no-untyped-def]
        step.text = ""

    app = make_app(load=[plugin_module(pre_step=pre_step)])
    result = app.run("anything", model="echo")
    assert result.outcome == "rejected"
    assert ledger_types(result.path)[-2:] == ["step/rejected", "turn/end"]


def test_step_limit_ends_turn_with_budget(make_app, plugin_module, script):
    loop = {"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 1}}]}
    app = make_app(load=[plugin_module(register_tools=register_tools)], max_steps=2)
    result = app.run("loop", model=script(loop, loop, loop, {"text": "never"}))
    assert result.outcome == "budget"
    assert "step limit" in result.reason
    assert result.steps == 2
    events = app.store.read(result.session_id)
    assert events[-1].outcome == "budget"  # type: ignore[attr-defined]


def test_turn_stopping_continues_bounded(make_app, plugin_module):
    calls = []

    @hookimpl
    def turn_stopping(turn):  # type: ignore[no-untyped-def]
        calls.append(turn.steps)
        return "keep going"

    app = make_app(load=[plugin_module(turn_stopping=turn_stopping)], max_continuations=2)
    result = app.run("start", model="echo")
    assert result.outcome == "completed"
    assert calls == [1, 2, 3]  # asked every time; the third answer is past the bound
    assert result.reason.startswith("continuation limit reached (2)")
    events = app.store.read(result.session_id)
    users = [e for e in events if e.type == "user/message"]
    assert [u.text for u in users] == ["start", "keep going", "keep going"]  # type: ignore[attr-defined]
    assert users[1].source.startswith("plugin:dsh_test_plugin")  # type: ignore[attr-defined]


def test_provider_error_ends_turn_with_error(make_app, script):
    app = make_app()
    result = app.run("hi", model=script({"error": "overloaded", "status": 529}))
    assert result.outcome == "error"
    assert "overloaded" in result.reason
    events = app.store.read(result.session_id)
    assert [e.type for e in events] == [
        "turn/start", "step/start", "user/message", "step/end", "turn/end"
    ]
    assert events[-1].outcome == "error"  # type: ignore[attr-defined]
    # and the session still resumes
    again = app.run("hi", model="echo", session=result.session_id)
    assert again.outcome == "completed"


def test_plugin_error_names_plugin_and_hook(make_app, plugin_module):
    @hookimpl
    def pre_step(step):  # type: ignore[no-untyped-def]
        raise RuntimeError("kaboom")

    name = plugin_module(pre_step=pre_step)
    app = make_app(load=[name])
    result = app.run("hi", model="echo")
    assert result.outcome == "error"
    assert f"plugin {name} raised in hook pre_step" in result.reason
    assert "kaboom" in result.reason
    assert ledger_types(result.path) == ["turn/start", "turn/end"]


def test_no_save_writes_nothing(make_app, tmp_path):
    app = make_app()
    result = app.run("hi", model="echo", save=False)
    assert result.output == "hi" and result.path is None
    assert not (tmp_path / "sessions").exists()


def test_stop_between_steps_resolves_with_output(make_app, plugin_module, script):
    @hookimpl
    def post_execute(call, outcome):  # type: ignore[no-untyped-def]
        from dsh.host.runcontext import context

        context().stop()

    app = make_app(load=[plugin_module(register_tools=register_tools,
                                       post_execute=post_execute)])
    result = app.run("x", model=script(
        {"text": "partial", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]},
        {"text": "never reached"},
    ))
    assert result.outcome == "stopped"
    assert result.output == "partial"
    types = ledger_types(result.path)
    assert types[-3:] == ["tool/result", "step/end", "turn/end"]


def test_sigkill_mid_tool_resumes(tmp_path: Path):
    """A run killed with SIGKILL inside a tool call: the ledger loads, the dangling call is
    closed as interrupted, no earlier line is lost."""
    plugdir = tmp_path / "plug"
    plugdir.mkdir()
    marker = tmp_path / "in-tool"
    (plugdir / "slowplug.py").write_text(textwrap.dedent(f"""
        import os, time
        from dsh import hookimpl

        def slow() -> str:
            '''Take forever.'''
            open({str(marker)!r}, "w").close()
            time.sleep(60)
            return "done"

        @hookimpl
        def register_tools(register):
            register(slow)
    """))
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"responses": [
        {"tool_calls": [{"name": "slow", "arguments": {}}]}, {"text": "after"}]}))
    sessions = tmp_path / "sessions"
    code = textwrap.dedent(f"""
        from dsh.run.app import App
        app = App.from_config({{"autoload": False, "load": ["slowplug"],
                               "sessions_dir": {str(sessions)!r}}})
        app.run("go", model="scripted:{script}")
    """)
    import os
    import signal
    import time

    env = {**os.environ, "PYTHONPATH": f"{plugdir}{os.pathsep}{os.getcwd()}"}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    deadline = time.monotonic() + 30
    while not marker.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "tool never started"
        time.sleep(0.02)
    before = next(sessions.glob("*.jsonl")).read_text().splitlines()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert [json.loads(x)["type"] for x in before][-1] == "tool/call"

    store = JsonlStore(sessions)
    sid = next(sessions.glob("*.jsonl")).stem
    with store.open(sid) as ledger:
        assert any("dangling" in n for n in ledger.notes)
        assert not ledger.projection.pending
    after = (sessions / f"{sid}.jsonl").read_text().splitlines()
    assert after[: len(before)] == before  # nothing earlier lost
    tail = [load_event(x) for x in after[len(before):]]
    assert [e.type for e in tail] == ["tool/result", "step/end", "turn/end"]
    assert tail[0].status == "interrupted"  # type: ignore[attr-defined]
    # the next request has no dangling call: every assistant tool call has a result
    from dsh.run.app import App

    app = App.from_config({"autoload": False, "sessions_dir": str(sessions)})
    res = app.run("resume", model="echo", session=sid)
    assert res.outcome == "completed"
    with app.store.open(sid) as ledger:
        msgs = list(ledger.projection.view())
    called = {c.id for m in msgs for c in m.tool_calls}
    answered = {m.tool_call_id for m in msgs if m.role == "tool"}
    assert called == answered


@pytest.mark.parametrize("outcome_hook", ["pre_execute", "execute"])
def test_plugin_raising_in_tool_chain_ends_with_error(make_app, plugin_module, script,
                                                      outcome_hook):
    if outcome_hook == "pre_execute":
        @hookimpl
        def hook(call):  # type: ignore[no-untyped-def]
            raise ValueError("nope")
    else:
        @hookimpl(wrapper=True)
        def hook(call):  # type: ignore[no-untyped-def]
            raise ValueError("nope")
            yield  # pragma: no cover

    name = plugin_module(register_tools=register_tools, **{outcome_hook: hook})
    app = make_app(load=[name])
    result = app.run("x", model=script(*TWO_STEP))
    assert result.outcome == "error"
    assert f"plugin {name} raised in hook {outcome_hook}" in result.reason
    events = app.store.read(result.session_id)
    # the dangling call was closed, so the ledger is consistent
    assert [e.type for e in events][-3:] == ["tool/result", "step/end", "turn/end"]
    assert events[-3].status == "interrupted"  # type: ignore[attr-defined]
