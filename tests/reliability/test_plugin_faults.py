"""A plugin raising in each hook: the error names the plugin and the hook, the turn ends with
outcome ``error`` (or assembly fails before any session exists), the ledger stays consistent."""

from __future__ import annotations

import pytest

from dsh.core.errors import PluginError
from dsh.hookspecs import hookimpl


def tool_t() -> str:
    """A tool."""
    return "ok"


@hookimpl
def register_tools(register):  # type: ignore[no-untyped-def]
    register(tool_t, name="t")


def _raiser(hook: str):  # type: ignore[no-untyped-def]
    def boom(*args):  # type: ignore[no-untyped-def]
        raise RuntimeError(f"{hook} exploded")

    def wrap(call):  # type: ignore[no-untyped-def]
        raise RuntimeError(f"{hook} exploded")
        yield  # pragma: no cover

    argnames = {
        "configure": "app", "register_tools": "register", "register_prompt": "register",
        "pre_step": "step", "pre_execute": "call", "post_execute": "call, outcome",
        "turn_stopping": "turn", "observe_event": "event", "register_models": "register",
    }
    if hook in ("request", "execute"):
        return hookimpl(wrapper=True)(wrap)
    ns: dict = {"boom": boom}
    exec(f"def {hook}({argnames[hook]}):\n    boom()", ns)  # real argument names for pluggy
    return hookimpl(ns[hook])


ASSEMBLY = ["configure", "register_tools", "register_prompt", "register_models"]
RUNTIME = ["pre_step", "request", "execute", "pre_execute", "post_execute", "turn_stopping",
           "observe_event"]


@pytest.mark.parametrize("hook", ASSEMBLY)
def test_assembly_hook_raising_names_plugin_and_hook(make_app, plugin_module, hook, tmp_path):
    name = plugin_module(**{hook: _raiser(hook)})
    app = make_app(load=[name])
    with pytest.raises(PluginError, match=f"plugin {name} raised in hook {hook}: RuntimeError"):
        app.run("hi", model="echo")
    assert not list((tmp_path / "sessions").glob("*.jsonl"))  # nothing half-written


@pytest.mark.parametrize("hook", RUNTIME)
def test_runtime_hook_raising_ends_turn_with_error(make_app, plugin_module, script, hook):
    tools = {"register_tools": register_tools} if hook != "register_tools" else {}
    name = plugin_module(**tools, **{hook: _raiser(hook)})
    app = make_app(load=[name])
    model = script({"tool_calls": [{"name": "t", "arguments": {}}]}, {"text": "done"},
                   {"text": "again"})
    result = app.run("hi", model=model)
    assert result.outcome == "error"
    assert f"plugin {name} raised in hook {hook}" in result.reason
    assert f"{hook} exploded" in result.reason
    events = app.store.read(result.session_id)
    assert events[-1].type == "turn/end" and events[-1].outcome == "error"
    # consistent: every tool call has a result, no step left open, and it resumes
    calls = {e.call_id for e in events if e.type == "tool/call"}
    results = {e.call_id for e in events if e.type == "tool/result"}
    assert calls == results
    starts = sum(e.type == "step/start" for e in events)
    assert starts == sum(e.type == "step/end" for e in events)
    again = make_app().run("resume", model="echo", session=result.session_id)
    assert again.outcome == "completed"
