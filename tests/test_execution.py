"""The execution model (MISSION D2, D6, D8, D9): sub-agents, chained budgets, every ending."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from dsh.hookspecs import hookimpl
from dsh.host.runcontext import CancelToken
from dsh.host.runcontext import Limits
from dsh.host.runcontext import context


def _ask(agent: str, prompt: str = "go") -> dict:
    return {"tool_calls": [{"name": f"ask_{agent}", "arguments": {"prompt": prompt}}]}


def _usage(n: int) -> dict:
    return {"usage": {"input_tokens": n, "output_tokens": n}}


@pytest.fixture
def nested(make_app, tmp_path: Path):
    """top → mid → leaf, each with its own scripted model file."""

    def make(top: list, mid: list, leaf: list, **config):
        paths = {}
        for name, responses in (("top", top), ("mid", mid), ("leaf", leaf)):
            p = tmp_path / f"{name}.json"
            p.write_text(json.dumps({"responses": responses}))
            paths[name] = f"scripted:{p}"
        agents = {
            "top": {"model": paths["top"], "subagents": ["mid"]},
            "mid": {"model": paths["mid"], "subagents": ["leaf"],
                    "description": "The middle manager."},
            "leaf": {"model": paths["leaf"]},
        }
        return make_app(agent="top", agents=agents, **config)

    return make


def _requests(app, session_id: str) -> int:
    return sum(1 for e in app.store.read(session_id) if e.type == "assistant/message")


def _child(app, session_id: str) -> str:
    return next(e.child_session for e in app.store.read(session_id)
                if e.type == "tool/call" and e.child_session)


def test_subagent_runs_nested_and_links_both_ways(nested):
    app = nested(top=[_ask("mid", "summarise"), {"text": "top done"}],
                 mid=[_ask("leaf", "details"), {"text": "mid answer"}],
                 leaf=[{"text": "leaf answer"}])
    assert app.agent("mid").tools["ask_leaf"].description == "Ask the leaf agent."
    assert app.agent("top").tools["ask_mid"].description == "The middle manager."
    result = app.run("start")
    assert (result.outcome, result.output) == ("completed", "top done")
    mid_sid = _child(app, result.session_id)
    leaf_sid = _child(app, mid_sid)
    mid_start = app.store.read(mid_sid)[0]
    assert (mid_start.parent, mid_start.agent) == (result.session_id, "mid")
    call = next(e for e in app.store.read(result.session_id) if e.type == "tool/call")
    assert mid_start.parent_call == call.call_id
    assert app.store.read(leaf_sid)[0].parent == mid_sid
    top_result = next(e for e in app.store.read(result.session_id) if e.type == "tool/result")
    assert top_result.output == "mid answer"
    assert app.store.info(mid_sid).parent == result.session_id


def test_chained_budget_stops_grandchild_at_parents_limit(nested):
    """pydantic-ai, measured here, let a child make 5 requests under a parent limit of 3."""
    loop = {"tool_calls": [{"name": "ask_leaf", "arguments": {"prompt": "again"}}]}
    leaf_loop = [{"text": f"step {i}", "tool_calls": []} for i in range(10)]
    app = nested(top=[_ask("mid"), {"text": "never"}],
                 mid=[loop, loop, loop, loop, {"text": "never"}],
                 leaf=leaf_loop, limits={"requests": 3})
    result = app.run("start")
    assert result.outcome == "budget"
    assert result.reason == "model requests limit reached (3/3)"
    mid_sid = _child(app, result.session_id)
    leaf_sid = _child(app, mid_sid)
    total = sum(_requests(app, s) for s in (result.session_id, mid_sid, leaf_sid))
    assert total == 3  # no overshoot for a request limit: it is known before the call
    mid_end = app.store.read(mid_sid)[-1]
    assert (mid_end.outcome, mid_end.reason) == (
        "budget", "model requests limit reached in a parent run (3/3)")


def test_token_budget_overshoots_at_most_one_call_per_level(nested):
    big = _usage(50)  # every call uses 100 tokens
    app = nested(top=[{**_ask("mid"), **big}, {"text": "never", **big}],
                 mid=[{**_ask("leaf"), **big}, {"text": "never", **big}],
                 leaf=[{"text": "leaf", **big}, {"text": "x", **big}],
                 limits={"total_tokens": 150})
    result = app.run("start")
    assert result.outcome == "budget"
    sessions = [result.session_id, _child(app, result.session_id)]
    try:
        sessions.append(_child(app, sessions[-1]))
    except StopIteration:  # mid stopped before calling leaf
        pass
    total = sum(_requests(app, s) for s in sessions)
    # 150 tokens allow 2 calls (200 ≥ 150 stops); depth 2 may add one call per level
    assert 2 <= total <= 2 + 2
    assert result.usage.total_tokens >= 150


def test_api_limits_override_config(make_app, script):
    loop = {"tool_calls": [{"name": "nope", "arguments": {}}]}
    app = make_app(limits={"tool_calls": 100})
    result = app.run("x", model=script(loop, loop, loop, {"text": "end"}),
                     limits=Limits(tool_calls=2))
    assert (result.outcome, result.reason) == ("budget", "tool calls limit reached (2/2)")


def test_cost_budget_uses_price_table(make_app, script):
    call = {"tool_calls": [{"name": "nope", "arguments": {}}], **_usage(500_000)}
    model = script(call, call, call, {"text": "end"})
    app = make_app(models={model: {"price": {"input": 1.0, "output": 3.0}}},
                   limits={"cost": 3.0})
    result = app.run("x", model=model)
    # each call costs 0.5 + 1.5 = 2.0; the second reaches 4.0 ≥ 3.0
    assert (result.outcome, result.reason) == ("budget", "cost limit reached (4.0000/3)")


def test_time_budget(make_app, script):
    slow = {"tool_calls": [{"name": "nope", "arguments": {}}], "delay": 0.15}
    app = make_app(limits={"seconds": 0.2})
    result = app.run("x", model=script(slow, slow, slow, {"text": "end"}))
    assert result.outcome == "budget" and "time limit reached" in result.reason


# --- every ending runs the cleanups, in reverse order ----------------------------------------


def _cleanup_plugin(order: list, on_step=None):
    @hookimpl
    def pre_step(step):  # type: ignore[no-untyped-def]
        if step.index == 0:
            ctx = context()
            ctx.add_cleanup(lambda: order.append("first"))
            ctx.add_cleanup(lambda: order.append("second"))
        if on_step:
            on_step(step)

    return pre_step


@pytest.mark.parametrize("ending", ["completed", "error", "aborted", "stopped", "budget"])
def test_every_ending_runs_cleanups_in_reverse(make_app, plugin_module, script, ending):
    order: list[str] = []
    handle = {}

    def on_step(step):  # type: ignore[no-untyped-def]
        if ending == "stopped" and step.index == 0:
            context().stop()

    responses = {
        "completed": [{"text": "ok"}],
        "error": [{"error": "provider down"}],
        "aborted": [{"text": "slow", "delay": 5}],
        "stopped": [{"tool_calls": [{"name": "x", "arguments": {}}]}, {"text": "late"}],
        "budget": [{"tool_calls": [{"name": "x", "arguments": {}}]}] * 3,
    }[ending]
    app = make_app(load=[plugin_module(pre_step=_cleanup_plugin(order, on_step))],
                   max_steps=1 if ending == "budget" else 20)
    if ending == "aborted":
        timer = threading.Timer(0.2, lambda: handle["ctx"].abort("test abort"))
        timer.start()
    t0 = time.monotonic()
    result = app.run("go", model=script(*responses),
                     context_hook=lambda ctx: handle.setdefault("ctx", ctx))
    assert result.outcome == ending, result.reason
    assert order == ["second", "first"]
    if ending == "aborted":
        assert time.monotonic() - t0 < 2  # woke up at once, not after the 5 s delay
        assert "test abort" in result.reason
    events = app.store.read(result.session_id)
    assert events[-1].type == "turn/end" and events[-1].outcome == ending


def test_callers_cancel_signal_combines_with_the_runs(make_app, script):
    mine = CancelToken()
    threading.Timer(0.1, lambda: mine.cancel("caller gave up")).start()
    result = make_app().run("x", model=script({"text": "slow", "delay": 5}), cancel=mine)
    assert result.outcome == "aborted" and "caller gave up" in result.reason


def test_abort_closes_dangling_tool_calls(make_app, plugin_module, script):
    started = threading.Event()

    def slow() -> str:
        """Slow, but polite: polls the cancel token."""
        started.set()
        ctx = context()
        ctx.cancel.wait(5)
        ctx.cancel.check()
        return "never"

    @hookimpl
    def register_tools(register):  # type: ignore[no-untyped-def]
        register(slow)

    handle = {}
    app = make_app(load=[plugin_module(register_tools=register_tools)])
    threading.Thread(target=lambda: (started.wait(5), handle["ctx"].abort())).start()
    result = app.run("x", model=script({"tool_calls": [{"name": "slow", "arguments": {}}]}),
                     context_hook=lambda ctx: handle.setdefault("ctx", ctx))
    events = app.store.read(result.session_id)
    assert result.outcome == "aborted"
    tool_result = next(e for e in events if e.type == "tool/result")
    assert tool_result.status == "interrupted" and "aborted" in tool_result.output
    assert events[-1].type == "turn/end"


# --- parallel (D6) ---------------------------------------------------------------------------


def test_parallel_results_in_task_order_and_a_failure_is_isolated(make_app, tmp_path):
    files = {}
    for name, responses in (("slow", [{"text": "slow answer", "delay": 0.2}]),
                            ("fast", [{"text": "fast answer"}]),
                            ("broken", [{"error": "exploded"}])):
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps({"responses": responses}))
        files[name] = {"model": f"scripted:{p}"}
    app = make_app(agents={**files, "main": {"model": "echo"}})
    with app.session("main") as parent:
        parent.send("context for everyone")
        results = app.parallel(
            [("slow", "a"), ("broken", "b"), ("fast", "c"), ("ghost", "d")], parent=parent)
        assert [r.outcome for r in results] == ["completed", "error", "completed", "error"]
        assert results[0].output == "slow answer" and "exploded" in results[1].reason
        assert "unknown agent 'ghost'" in results[3].reason
        # each child saw the same frozen read of the parent's history, in its own ledger
        for r in (results[0], results[2]):
            injected = [e for e in app.store.read(r.session_id) if e.type == "context/injected"]
            assert "context for everyone" in injected[0].text
            assert injected[0].source == f"fork:{parent.id}"
        parent.send("what came back?")
    events = app.store.read(parent.id)
    injected = [e for e in events if e.type == "context/injected"]
    # deterministic: task order, although "fast" finished first
    assert [e.source.split(":")[1] for e in injected] == ["slow", "broken", "fast", "ghost"]
    assert injected[0].text == "slow answer" and injected[1].text.startswith("error:")


# --- conditional observation (D7) --------------------------------------------------------------


def test_unobserved_run_builds_nothing_and_observer_added_late_warns(make_app, plugin_module):
    from dsh.host.runcontext import UnobservedRunWarning

    seen = {}

    @hookimpl
    def pre_step(step):  # type: ignore[no-untyped-def]
        ctx = context()
        seen["emit"] = ctx.emit
        with pytest.warns(UnobservedRunWarning, match="started unobserved"):
            ctx.observe(lambda e: seen.setdefault("events", []).append(e))

    app = make_app(load=[plugin_module(pre_step=pre_step)])
    result = app.run("hi", model="echo")
    assert result.outcome == "completed"
    assert seen["emit"] is None and "events" not in seen


def test_observed_run_streams_and_delivers_live_and_persistent_events(make_app, plugin_module):
    got: list = []

    @hookimpl
    def pre_step(step):  # type: ignore[no-untyped-def]
        context().observe(got.append)  # observed run: no warning

    app = make_app(load=[plugin_module(pre_step=pre_step)])
    result = app.run("a b", model="echo", observe=True)
    types = [e.type for e in got]
    assert "llm/stream" in types and "agent/request" in types and "assistant/message" in types
    assert result.outcome == "completed"


def test_observer_plugin_makes_runs_observed_and_streaming(make_app, plugin_module):
    got: list = []

    @hookimpl
    def observe_event(event):  # type: ignore[no-untyped-def]
        got.append(event)

    @hookimpl(wrapper=True)
    def request(call):  # type: ignore[no-untyped-def]
        got.append(("stream", call.request.stream))
        return (yield)

    app = make_app(load=[plugin_module(observe_event=observe_event, request=request)])
    app.run("x y", model="echo")
    assert ("stream", True) in got
    deltas = [e.data["delta"] for e in got if getattr(e, "type", "") == "llm/stream"]
    assert "".join(deltas) == "x y"
    unobserved: list = []

    @hookimpl(wrapper=True)
    def request2(call):  # type: ignore[no-untyped-def]
        unobserved.append(call.request.stream)
        return (yield)

    make_app(load=[plugin_module(request=request2)]).run("x", model="echo")
    assert unobserved == [False]  # nobody watching: the provider is not asked to stream
