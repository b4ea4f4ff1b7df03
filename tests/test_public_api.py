"""The public surface for plugin authors (docs/api.md): everything a plugin needs is a name of
``dsh``, imported lazily; the names it replaced keep working with a DeprecationWarning."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import dsh

REPO = Path(__file__).resolve().parent.parent

#: What ``import dsh`` imports beyond ``python -c pass`` (Python 3.11): dsh's three modules
#: and typing. Every public name is imported when first used, never by ``import dsh``.
IMPORT_DSH = {"_typing", "collections.abc", "dsh", "dsh._compat", "dsh._version", "typing",
              "typing.io", "typing.re"}


def test_all_is_sorted_complete_and_every_name_imports() -> None:
    assert dsh.__all__ == sorted(dsh.__all__)
    assert len(dsh.__all__) == len(set(dsh.__all__))
    for name in dsh.__all__:
        assert getattr(dsh, name) is not None, name
    lazy = set(dsh._LAZY)
    assert lazy | {"__version__", "sandbox"} == set(dsh.__all__)  # nothing lazy is hidden
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        dsh.nope  # noqa: B018


def test_the_names_a_plugin_needs_are_there() -> None:
    for name in ("tool", "hookimpl", "StateKey", "StateError", "DshError", "ToolError",
                 "UsageError", "ConfigError", "PluginError", "context", "RunContext",
                 "CancelToken", "current_call", "Ask", "Decision", "request_approval",
                 "escape_controls", "Change", "App", "AgentHandle", "Stash", "StashKey",
                 "pass_app", "settings", "sandbox", "ToolInvocation", "NoToolCall", "Limits"):
        assert name in dsh.__all__, name
    assert dsh.sandbox.run is not None and dsh.sandbox.Popen is not None
    assert {"run", "Popen", "Result", "allowed_env"} <= set(dsh.sandbox.__all__)
    assert issubclass(dsh.StateError, dsh.PluginError)
    assert issubclass(dsh.ToolError, dsh.DshError) and issubclass(dsh.NoToolCall, LookupError)


def test_import_dsh_stays_cheap(tmp_path: Path) -> None:
    code = ("import sys; before = set(sys.modules); import dsh; "
            "print('\\n'.join(sorted(set(sys.modules) - before)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert set(proc.stdout.split()) == IMPORT_DSH


def test_every_public_name_is_in_the_api_doc() -> None:
    doc = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    missing = [n for n in dsh.__all__ if f"`{n}" not in doc]
    assert missing == [], f"docs/api.md does not list {missing}"


# ---------------------------------------------------------------------------- current_call


def test_current_call_outside_a_tool_call_names_the_problem() -> None:
    with pytest.raises(dsh.NoToolCall, match=r"dsh.current_call\(\) called outside a tool"):
        dsh.current_call()
    with pytest.raises(LookupError):  # as before it had a name
        dsh.current_call()


def test_current_call_and_agent_name_inside_a_tool(dsh_make_app: Any) -> None:
    seen: list[tuple[str, str, str]] = []

    class Probe:
        @dsh.hookimpl
        def register_tools(self, register: Any) -> None:
            def probe() -> str:
                """Report the call."""
                call = dsh.current_call()
                seen.append((call.call.name, call.agent_name, dsh.context().agent_name))
                assert call.handle.name == call.agent_name
                return "ok"

            register(probe)

    app = dsh_make_app({"autoload": False}, plugins={"probe": Probe()})
    app.script.tool_call("probe").text("done")
    assert app.run("go").outcome == "completed"
    assert seen == [("probe", "default", "default")]


# ------------------------------------------------------------------ deprecated `.agent`


def test_agent_is_a_deprecated_alias_of_agent_name() -> None:
    from dsh.core.messages import ToolCall

    ctx = dsh.RunContext(run_id="r", agent_name="a", ledger=None)  # type: ignore[arg-type]
    old = dsh.RunContext(run_id="r", agent="b", ledger=None)  # type: ignore[arg-type]
    assert (ctx.agent_name, old.agent_name) == ("a", "b")  # the old keyword still builds one
    with pytest.warns(DeprecationWarning, match=r"RunContext.agent is deprecated: use "
                                                r"\.agent_name"):
        assert ctx.agent == "a"
    inv = dsh.ToolInvocation(ToolCall(id="1", name="t"), None, {}, agent_name="w")
    with pytest.warns(DeprecationWarning, match="ToolInvocation.agent is deprecated") as w:
        assert inv.agent == "w"
    assert w[0].filename == __file__  # points at the caller's line
    assert dsh.ToolInvocation(ToolCall(id="1", name="t"), None, {}, agent="v").agent_name == "v"
    with pytest.raises(TypeError, match="agent_name= only"):
        dsh.ToolInvocation(ToolCall(id="1", name="t"), None, {}, agent="v", agent_name="w")


def test_dsh_itself_never_reads_the_deprecated_alias() -> None:
    """A run under ``-W error::DeprecationWarning`` with a tool and a sub-agent succeeds:
    no code of dsh or its first-party plugins reads ``.agent`` of a call or context."""
    import re

    pattern = re.compile(r"\b(call|inv|ctx|invocation|context\(\)|current_call\(\))\.agent\b"
                         r"(?!_|\()")
    hits = []
    for root in ("dsh", "plugins", "examples"):
        for path in (REPO / root).rglob("*.py"):
            if "build" in path.parts:
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line) and "ModelCall" not in line:
                    hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    # `call.agent` of a ModelCall (the request hook) is the agent's name there: not these
    allowed = [h for h in hits if "dsh_timing" in h or "hookspecs.py" in h]
    assert sorted(set(hits) - set(allowed)) == []


# ----------------------------------------------------------------------------- StateError


def test_state_error_carries_the_reducers_own_exception(dsh_make_app: Any) -> None:
    class Full(Exception):
        pass

    def reduce(state: int, data: Any) -> int:
        if state >= 1:
            raise Full("no room")
        return state + 1

    key = dsh.StateKey("counter", "n", 0, reduce)
    got: list[Any] = []

    class Counter:
        @dsh.hookimpl
        def register_tools(self, register: Any) -> None:
            def bump() -> str:
                """Count."""
                try:
                    got.append(key.update({}))
                except dsh.StateError as err:
                    got.append(err)
                return "ok"

            register(bump)

    app = dsh_make_app({"autoload": False}, plugins={"counter": Counter()})
    app.script.tool_call("bump").tool_call("bump").text("done")
    app.run("go")
    assert got[0] == 1  # update's return value: the new state
    err = got[1]
    assert isinstance(err.reducer_error, Full) and err.reducer_error is err.__cause__
    assert "the reducer raised Full: no room" in str(err)
    assert dsh.StateError("refused", plugin="p").reducer_error is None


# ---------------------------------------------------------------------------- CancelToken


def test_cancel_token_on_cancel_contract() -> None:
    token = dsh.CancelToken()
    calls: list[str] = []
    unregister = token.on_cancel(lambda: calls.append("first"))
    token.on_cancel(lambda: calls.append("second"))()  # unregistered at once: never runs
    assert calls == []
    token.cancel("stop")
    assert calls == ["first"] and token.cancelled and token.reason == "stop"
    token.cancel("again")  # once only
    assert calls == ["first"]
    unregister()  # after it ran: a no-op
    late = token.on_cancel(lambda: calls.append("late"))  # already fired: runs at once
    assert calls == ["first", "late"]
    late()
    with pytest.raises(dsh.Cancelled, match="run aborted: stop"):
        token.check()


def test_cancel_token_wakes_a_waiting_thread() -> None:
    token = dsh.CancelToken()
    woke = threading.Event()
    worker = threading.Thread(target=lambda: token.wait(60) and woke.set())
    worker.start()
    token.cancel()
    worker.join(60)
    assert woke.is_set()


# ---------------------------------------------------------------------------- pass_app


def test_pass_app_gives_a_plugin_command_the_app(tmp_path: Path) -> None:
    """A real ``dsh`` process: the plugin's command receives the App built from --config."""
    (tmp_path / "cmdplugin.py").write_text(
        "import click, dsh\n"
        "@dsh.hookimpl\n"
        "def register_commands(cli):\n"
        "    @cli.command('whoami')\n"
        "    @click.argument('greeting')\n"
        "    @dsh.pass_app\n"
        "    def whoami(app, greeting):\n"
        "        click.echo(f'{greeting} {type(app).__name__} {app.config.max_steps}')\n")
    cfg = tmp_path / "config.toml"
    cfg.write_text('model = "echo"\nautoload = false\nload = ["cmdplugin"]\nmax_steps = 7\n')
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DSH_")},
           "PYTHONPATH": str(tmp_path), "DSH_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-m", "dsh",
                           "--config", str(cfg), "whoami", "hello"], capture_output=True,
                          text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "hello App 7\n"


# ------------------------------------------------------------------------- dsh.testing


def test_plugin_events_and_limits_as_a_mapping(dsh_make_app: Any) -> None:
    class Recorder:
        @dsh.hookimpl
        def register_tools(self, register: Any, agent: dsh.AgentHandle) -> None:
            def note(text: str) -> str:
                """Record."""
                agent.record_event("rec", "note", {"text": text})
                return "ok"

            register(note)

    app = dsh_make_app({"autoload": False}, plugins={"rec": Recorder()})
    app.script.tool_call("note", text="a").tool_call("note", text="b").text("done")
    result = app.run("go", limits={"steps": 2})
    assert result.outcome == "budget"  # the mapping is a Limits: the second step is refused
    assert [d["text"] for d in result.plugin_events("rec", "note")] == ["a"]
    app.script.replies.clear()
    app.script.tool_call("note", text="b").text("done")
    again = app.run("more", session=result.session_id, limits={"steps": 5})
    assert again.outcome == "completed"
    assert [d["text"] for d in again.plugin_events("rec", "note")] == ["a", "b"]  # in order
    assert result.plugin_events("rec", "other") == [] and result.plugin_events("x") == []
    with pytest.raises(TypeError, match="limits: unknown limit 'step'; did you mean 'steps'"):
        app.run("go", limits={"step": 2})
