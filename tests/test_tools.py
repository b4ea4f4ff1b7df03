"""Tools: schema from signatures, validation, error results, concurrency, timeouts."""

from __future__ import annotations

import threading
import time
from typing import Literal

import pytest

from dsh import tool
from dsh.core.errors import ToolError
from dsh.core.messages import ToolCall
from dsh.hookspecs import hookimpl
from dsh.tools.registry import ToolInvocation
from dsh.tools.registry import build_tool
from dsh.tools.registry import call_tool
from dsh.tools.registry import parse_docstring
from dsh.tools.registry import validate


def search(query: str, limit: int = 10, tags: list[str] | None = None,
           mode: Literal["fast", "deep"] = "fast", ratio: float = 0.5) -> str:
    """Search the notes.

    Longer explanation.

    :param query: what to look for
    :param limit: at most this many hits
    """
    return f"{query}:{limit}"


def test_schema_from_type_hints_and_docstring():
    t = build_tool(search, plugin="p")
    assert t.description == "Search the notes.\n\nLonger explanation."
    assert t.parameters == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "what to look for"},
            "limit": {"type": "integer", "description": "at most this many hits", "default": 10},
            "tags": {"type": ["array", "null"], "items": {"type": "string"}, "default": None},
            "mode": {"enum": ["fast", "deep"], "default": "fast"},
            "ratio": {"type": "number", "default": 0.5},
        },
        "required": ["query"],
        "additionalProperties": False,
    }


def test_google_style_docstring():
    def f(x: int) -> None:
        """Do it.

        Args:
            x (int): the value,
                continued here.
        """

    summary, params = parse_docstring(f.__doc__)
    assert summary == "Do it."
    assert params == {"x": "the value, continued here."}


def test_tool_decorator_options():
    @tool(name="renamed", sequential=True, timeout=2)
    def f() -> str:
        """Doc."""
        return "x"

    t = build_tool(f)
    assert (t.name, t.sequential, t.timeout, t.description) == ("renamed", True, 2, "Doc.")


def test_untranslatable_type_is_a_clear_error():
    def f(x: threading.Thread) -> None: ...

    with pytest.raises(TypeError, match="tool 'f' param x: cannot describe type"):
        build_tool(f)


@pytest.mark.parametrize("args, problem", [
    ({}, "missing required argument 'query'"),
    ({"query": 3}, "arguments.query: expected string, got integer"),
    ({"query": "q", "limit": True}, "arguments.limit: expected integer, got boolean"),
    ({"query": "q", "mode": "slow"}, 'arguments.mode: must be one of ["fast", "deep"]'),
    ({"query": "q", "tags": ["a", 1]}, "arguments.tags[1]: expected string"),
    ({"query": "q", "bogus": 1}, "unexpected argument 'bogus'"),
])
def test_validation_messages(args, problem):
    t = build_tool(search)
    errors = validate(args, t.parameters)
    assert any(problem in e for e in errors), errors
    outcome = call_tool(ToolInvocation(ToolCall(id="1", name="search"), t, args))
    assert outcome.status == "error" and problem in outcome.output


def test_valid_call_and_exceptions_become_results():
    t = build_tool(search)
    ok = call_tool(ToolInvocation(ToolCall(id="1", name="search"), t, {"query": "q"}))
    assert (ok.status, ok.output) == ("ok", "q:10")

    def boom() -> None:
        raise KeyError("missing")

    def clean() -> None:
        raise ToolError("file is too large")

    err = call_tool(ToolInvocation(ToolCall(id="2", name="boom"), build_tool(boom), {}))
    assert (err.status, err.output) == ("error", "KeyError: 'missing'")
    err2 = call_tool(ToolInvocation(ToolCall(id="3", name="clean"), build_tool(clean), {}))
    assert err2.output == "file is too large"
    unknown = call_tool(ToolInvocation(ToolCall(id="4", name="ghost"), None, {}))
    assert unknown.output == "unknown tool 'ghost'"


def test_non_string_results_are_json():
    def data() -> dict:
        return {"a": [1, 2]}

    out = call_tool(ToolInvocation(ToolCall(id="1", name="data"), build_tool(data), {}))
    assert out.output == '{"a": [1, 2]}'


def test_timeout_becomes_error_result():
    @tool(timeout=0.05)
    def slow() -> str:
        time.sleep(1)
        return "late"

    out = call_tool(ToolInvocation(ToolCall(id="1", name="slow"), build_tool(slow), {}))
    assert out.output == "tool 'slow' timed out after 0.05s"


def _plugin(**tools):
    @hookimpl
    def register_tools(register):  # type: ignore[no-untyped-def]
        for fn in tools.values():
            register(fn)

    return register_tools


def test_calls_run_concurrently_and_log_in_call_order(make_app, plugin_module, script):
    barrier = threading.Barrier(3, timeout=5)

    def wait(n: int) -> str:
        """Wait at the barrier."""
        barrier.wait()  # deadlocks unless all three calls run at once
        time.sleep(0.01 * (3 - n))  # finish in reverse order
        from dsh.host.runcontext import context

        return f"{n}:{context().agent_name}"  # the run's context reaches worker threads

    app = make_app(load=[plugin_module(register_tools=_plugin(wait=wait))])
    calls = [{"name": "wait", "arguments": {"n": i}, "id": f"c{i}"} for i in range(3)]
    result = app.run("go", model=script({"tool_calls": calls}, {"text": "done"}))
    assert result.outcome == "completed", result.reason
    events = app.store.read(result.session_id)
    results = [e for e in events if e.type == "tool/result"]
    assert [r.call_id for r in results] == ["c0", "c1", "c2"]  # type: ignore[attr-defined]
    assert [r.output for r in results] == ["0:default", "1:default", "2:default"]  # type: ignore[attr-defined]
    types = [e.type for e in events]
    assert types[4:10] == ["tool/call"] * 3 + ["tool/result"] * 3


def test_sequential_tool_is_not_run_concurrently(make_app, plugin_module, script):
    active = []
    peak = []

    @tool(sequential=True)
    def one(n: int) -> int:
        """Count."""
        active.append(n)
        peak.append(len(active))
        time.sleep(0.02)
        active.remove(n)
        return n

    app = make_app(load=[plugin_module(register_tools=_plugin(one=one))])
    calls = [{"name": "one", "arguments": {"n": i}} for i in range(3)]
    result = app.run("go", model=script({"tool_calls": calls}, {"text": "done"}))
    assert result.outcome == "completed"
    assert max(peak) == 1


def test_bad_call_is_an_error_result_the_model_reads(make_app, plugin_module, script):
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    app = make_app(load=[plugin_module(register_tools=_plugin(add=add))])
    result = app.run("go", model=script(
        {"tool_calls": [{"name": "add", "arguments": {"a": "x"}}]}, {"text": "sorry"}))
    assert result.outcome == "completed"
    with app.store.open(result.session_id) as ledger:
        tool_msg = list(ledger.projection.view())[2]
    assert tool_msg.is_error
    assert "expected integer, got string" in tool_msg.content
    assert "missing required argument 'b'" in tool_msg.content


def test_pre_execute_blocks_and_rewrites_post_execute_rewrites(make_app, plugin_module, script):
    def echo(text: str) -> str:
        """Echo."""
        return text

    @hookimpl
    def pre_execute(call):  # type: ignore[no-untyped-def]
        if call.arguments["text"] == "forbidden":
            call.block("not allowed here", plugin="policy")
        else:
            call.arguments["text"] = call.arguments["text"].upper()

    @hookimpl
    def post_execute(call, outcome):  # type: ignore[no-untyped-def]
        outcome.output += "!"

    name = plugin_module(register_tools=_plugin(echo=echo), pre_execute=pre_execute,
                         post_execute=post_execute)
    app = make_app(load=[name])
    result = app.run("go", model=script(
        {"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}},
                        {"name": "echo", "arguments": {"text": "forbidden"}}]},
        {"text": "done"}))
    results = [e for e in app.store.read(result.session_id) if e.type == "tool/result"]
    assert results[0].output == "HI!" and results[0].status == "ok"  # type: ignore[attr-defined]
    assert results[1].status == "error"  # type: ignore[attr-defined]
    # the plugin is named from its registration, as step/rejected does (plugin= is ignored)
    assert results[1].output == f"tool call blocked by {name}: not allowed here!"  # type: ignore[attr-defined]


def test_execute_wrapper_onion_order(make_app, plugin_module, script):
    order = []

    def t() -> str:
        """T."""
        order.append("tool")
        return "x"

    class Outer:
        @hookimpl(wrapper=True, tryfirst=True)
        def execute(self, call):  # type: ignore[no-untyped-def]
            order.append("outer-in")
            outcome = yield
            order.append("outer-out")
            return outcome

    class Inner:
        @hookimpl(wrapper=True)
        def execute(self, call):  # type: ignore[no-untyped-def]
            order.append("inner-in")
            outcome = yield
            outcome.output = "wrapped " + outcome.output
            order.append("inner-out")
            return outcome

    @hookimpl
    def pre_execute(call):  # type: ignore[no-untyped-def]
        order.append("pre")

    app = make_app(load=[
        plugin_module(register_tools=_plugin(t=t), pre_execute=pre_execute),
        plugin_module(outer=Outer(), execute=Outer().execute),
        plugin_module(execute=Inner().execute),
    ])
    result = app.run("go", model=script({"tool_calls": [{"name": "t", "arguments": {}}]},
                                        {"text": "done"}))
    assert order == ["outer-in", "inner-in", "pre", "tool", "inner-out", "outer-out"]
    out = [e for e in app.store.read(result.session_id) if e.type == "tool/result"][0]
    assert out.output == "wrapped x"  # type: ignore[attr-defined]


def test_duplicate_tool_names_are_an_error_naming_both(make_app, plugin_module):
    def dup() -> None:
        """D."""

    a = plugin_module(register_tools=_plugin(dup=dup))
    b = plugin_module(register_tools=_plugin(dup=dup))
    app = make_app(load=[a, b])
    from dsh.core.errors import PluginError

    with pytest.raises(PluginError, match=f"tool 'dup' registered twice: by {a} and {b}"):
        app.agent()
