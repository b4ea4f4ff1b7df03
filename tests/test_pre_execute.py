"""pre_execute, the rules (docs/plugins.md "pre_execute: the rules"), one test per answer:
every implementation runs, in pluggy's order; a block names the plugin from its registration;
an earlier block is visible to later implementations; a second block is kept, the first wins;
a wrapper of pre_execute is refused with the plugin named."""

from __future__ import annotations

from typing import Any

from dsh import hookimpl


def _tool(text: str) -> str:
    """Echo."""
    return text


def _register(register: Any, agent: Any) -> None:
    register(_tool, name="echo")


def run(make_app: Any, plugin_module: Any, script: Any, *impls: Any) -> tuple[Any, list[str]]:
    names = [plugin_module(pre_execute=impl) for impl in impls]
    tools = plugin_module(register_tools=hookimpl(_register))
    app = make_app(load=[tools, *names])
    result = app.run("go", model=script(
        {"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]}, {"text": "done"}))
    return result, names


def test_every_implementation_runs_in_pluggy_order_even_after_a_block(
        make_app: Any, plugin_module: Any, script: Any) -> None:
    seen: list[tuple[str, str | None, str | None]] = []

    def make(label: str, block: bool = False, **opts: Any) -> Any:
        @hookimpl(**opts)
        def pre_execute(call: Any) -> None:
            seen.append((label, call.blocked, call.blocked_by))
            if block:
                call.block(f"{label} says no")
        return pre_execute

    result, names = run(make_app, plugin_module, script,
                        make("first-registered"), make("blocker", block=True),
                        make("late", tryfirst=True), make("last", trylast=True),
                        make("newest"))
    assert result.outcome == "completed"
    # tryfirst, then the last registered first, trylast last; all five ran
    assert [s[0] for s in seen] == ["late", "newest", "blocker", "first-registered", "last"]
    # implementations after the block see it, with the blocking plugin's registered name
    assert seen[3][1:] == ("blocker says no", names[1])
    assert seen[4][1:] == ("blocker says no", names[1])
    assert seen[1][1:] == (None, None)


def test_the_first_block_wins_and_every_block_is_kept(make_app: Any, plugin_module: Any,
                                                      script: Any) -> None:
    kept: list[Any] = []

    @hookimpl
    def one(call: Any) -> None:
        call.block("first reason", plugin="lies")  # plugin= is ignored in pre_execute

    @hookimpl
    def two(call: Any) -> None:
        call.block("second reason")
        call.block("third reason")
        kept.append((call.blocked, call.blocked_by, list(call.blocks)))

    result, (n1, n2) = run(make_app, plugin_module, script, two, one)  # one is called first
    blocked, by, blocks = kept[0]
    assert (blocked, by) == ("first reason", n2)
    assert blocks == [(n2, "first reason"), (n1, "second reason"), (n1, "third reason")]
    app_events = [e for e in make_app().store.read(result.session_id) if e.type == "tool/result"]
    assert app_events[0].output == f"tool call blocked by {n2}: first reason"


def test_a_pre_execute_wrapper_is_refused_naming_the_plugin(make_app: Any, plugin_module: Any,
                                                           script: Any) -> None:
    @hookimpl(wrapper=True)
    def pre_execute(call: Any) -> Any:
        return (yield)

    result, (name,) = run(make_app, plugin_module, script, pre_execute)
    assert result.outcome == "error"
    assert f"plugin {name}: hook pre_execute cannot be wrapped" in result.reason
