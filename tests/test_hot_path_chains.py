"""The request and tool chains of an unobserved run leave out the built-in layers that would
only yield (dsh.tools.dispatch.lean_hook): the recorder, and the hook dispatch while no plugin
implements ``pre_execute`` or ``post_execute``. An observed run, or one with such a plugin,
runs every layer as before; a plugin registered during the run takes part from its next call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dsh
from dsh import hookimpl
from dsh.run.app import App

RECORDER, DISPATCH, BUDGET = "dsh.recorder", "dsh.tools:HookDispatch", "dsh.budget"


def shout(text: str) -> str:
    """Return the text in capitals."""
    return text.upper()


@hookimpl
def _register(register: Callable[..., None]) -> None:
    register(shout)


def _tool_then_text(script: Callable[..., str], calls: int = 1) -> str:
    steps = [{"tool_calls": [{"name": "shout", "arguments": {"text": f"hi {i}"}}]}
             for i in range(calls)]
    return script(*steps, {"text": "done"})


def _instrument(pm: Any, hook: str, log: list[str]) -> None:
    """Log, by plugin name, every wrapper of ``hook`` entered (pluggy calls impl.function)."""
    for impl in getattr(pm.hook, hook).get_hookimpls():
        if not impl.wrapper:
            continue

        def logged(*args: Any, _orig: Any = impl.function, _name: str = impl.plugin_name) -> Any:
            log.append(f"{hook}:{_name}")
            return (yield from _orig(*args))

        impl.function = logged


def _app(make_app: Callable[..., App], model: str, *load: str) -> tuple[App, list[str]]:
    app = make_app(model=model, load=list(load))
    log: list[str] = []
    _instrument(app.pm, "request", log)
    _instrument(app.pm, "execute", log)
    return app, log


def test_an_unobserved_run_leaves_out_the_recorder_and_an_idle_hook_dispatch(
        make_app, script, plugin_module) -> None:
    app, log = _app(make_app, _tool_then_text(script), plugin_module(register_tools=_register))
    with app.session() as s:
        result = s.send("go")
    assert result.outcome == "completed" and result.steps == 2, result.reason
    request, execute = ["request:" + BUDGET], ["execute:" + BUDGET]
    assert log == request + execute + request
    # the tool ran and its result reached the model's next request
    assert "HI 0" in [m.content for m in s.ledger.projection.view() if m.role == "tool"][0]


def test_an_observed_run_runs_every_layer_as_before(make_app, script, plugin_module) -> None:
    app, log = _app(make_app, _tool_then_text(script), plugin_module(register_tools=_register))
    events: list[str] = []
    with app.session() as s:
        result = s.send("go", on_event=lambda e: events.append(getattr(e, "type", "")))
    assert result.outcome == "completed", result.reason
    request = ["request:" + BUDGET, "request:" + RECORDER]
    execute = ["execute:" + BUDGET, "execute:" + DISPATCH, "execute:" + RECORDER]
    assert log == request + execute + request
    assert {"agent/request", "tools/pre-execute", "tools/post-execute"} <= set(events)


def test_a_pre_execute_or_post_execute_plugin_keeps_the_hook_dispatch(
        make_app, script, plugin_module) -> None:
    seen: list[str] = []

    @hookimpl
    def pre_execute(call: Any) -> None:
        seen.append("pre " + call.call.name)
        if call.arguments.get("text") == "hi 1":
            call.block("not that one")

    @hookimpl
    def post_execute(call: Any, outcome: Any) -> None:
        seen.append(f"post {call.call.name} {outcome.status}")
        outcome.output = outcome.output + " (checked)"

    for hooks, expect in (({"pre_execute": pre_execute}, ["pre shout", "pre shout"]),
                          ({"post_execute": post_execute}, ["post shout ok", "post shout ok"])):
        seen.clear()
        tools = plugin_module(register_tools=_register)
        app, log = _app(make_app, _tool_then_text(script, calls=2), tools, plugin_module(**hooks))
        with app.session() as s:
            result = s.send("go")
        assert result.outcome == "completed", result.reason
        assert seen == expect
        assert log.count("execute:" + DISPATCH) == 2 and "execute:" + RECORDER not in log
        outputs = [m.content for m in s.ledger.projection.view() if m.role == "tool"]
        if "pre_execute" in hooks:
            assert "HI 0" in outputs[0] and "blocked" in outputs[1] and "HI 1" not in outputs[1]
        else:
            assert all(o.endswith("(checked)") for o in outputs), outputs


def test_a_pre_execute_plugin_registered_during_the_run_sees_the_next_call(
        make_app, script, plugin_module) -> None:
    seen: list[str] = []

    class Late:
        @hookimpl
        def pre_execute(self, call: Any) -> None:
            seen.append(call.arguments["text"])

    def shout(text: str) -> str:
        """Return the text in capitals; register a pre_execute plugin on the first call."""
        pm = dsh.context().session.agent.pm
        if pm.get_plugin("late") is None:
            pm.register(Late(), name="late")
        return text.upper()

    @hookimpl
    def register(register: Callable[..., None]) -> None:
        register(shout)

    app, log = _app(make_app, _tool_then_text(script, calls=3), plugin_module(
        register_tools=register))
    with app.session() as s:
        result = s.send("go")
    assert result.outcome == "completed", result.reason
    assert seen == ["hi 1", "hi 2"]  # not the call that registered it: it was running
    assert [x for x in log if x.startswith("execute:")] == [
        "execute:" + BUDGET, "execute:" + BUDGET, "execute:" + DISPATCH,
        "execute:" + BUDGET, "execute:" + DISPATCH]
