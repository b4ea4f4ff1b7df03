"""Budgets exact under concurrency (MISSION D8, issue 9 §2).

Steps, model requests and tool calls reserve their place in every level of the budget chain
before they start, so their limits hold exactly whatever runs at once: parallel tool calls,
parallel sub-agents, at depths 1–3. Tokens, cost and time are known only after a unit ran:
their overshoot is bounded by the units already in flight (docs/execution.md, "Budgets").
Counts are measured from the ledgers of every session of a run tree, and once over real HTTP
(requests received by a loopback server).
"""

from __future__ import annotations

import json
import re
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.config.loader import config_from_dict
from dsh.core.errors import EXIT_LIMIT
from dsh.core.errors import BudgetExceeded
from dsh.core.errors import DshError
from dsh.hookspecs import hookimpl
from dsh.host.runcontext import Budget
from dsh.host.runcontext import CancelToken
from dsh.host.runcontext import Limits
from dsh.host.runcontext import RunContext
from dsh.ledger.writer import INTERRUPTED
from dsh.run.app import App
from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import openai_completion

# --- helpers -----------------------------------------------------------------------------------


def _ask(agent: str, n: int, prompt: str = "go") -> list[dict[str, Any]]:
    return [{"name": f"ask_{agent}", "arguments": {"prompt": f"{prompt} {i}"}} for i in range(n)]


def _work(n: int, delay: float = 0.0) -> list[dict[str, Any]]:
    return [{"name": "work", "arguments": {"i": i, "delay": delay}} for i in range(n)]


class Worker:
    """The plain tool ``work``, counting the calls that really ran (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ran: list[int] = []

    def plugin(self) -> Any:
        def work(i: int, delay: float = 0.0) -> str:
            """Do one unit of work."""
            if delay:
                time.sleep(delay)
            with self.lock:
                self.ran.append(i)
            return f"worked {i}"

        @hookimpl
        def register_tools(register):  # type: ignore[no-untyped-def]
            register(work)

        return register_tools


def _write_script(folder: Path, name: str, responses: list[dict[str, Any]]) -> str:
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"responses": responses}))
    return f"scripted:{path}"


def _tree(app: App, session_id: str) -> dict[str, Any]:
    """A session and, recursively, the sub-agent sessions its tool calls ran."""
    events = app.store.read(session_id)
    statuses = {e.call_id: e.status for e in events if e.type == "tool/result"}
    children = [
        _tree(app, e.child_session) for e in events
        if e.type == "tool/call" and e.child_session and statuses.get(e.call_id) in ("ok", "error")
    ]
    return {"id": session_id, "events": events, "children": children,
            "agent": events[0].agent}


def _own(node: dict[str, Any]) -> dict[str, int]:
    events = node["events"]
    return {
        "requests": sum(e.type == "assistant/message" for e in events),
        "steps": sum(e.type == "step/start" for e in events),
        # a call that reserved its unit ran (ok or error); "budget" never started, and
        # "interrupted" was never dispatched
        "tool_calls": sum(e.type == "tool/result" and e.status in ("ok", "error")
                          for e in events),
    }


def _total(node: dict[str, Any]) -> dict[str, int]:
    total = _own(node)
    for child in node["children"]:
        for key, value in _total(child).items():
            total[key] += value
    return total


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for c in node["children"] for n in _nodes(c))]


def _end(node: dict[str, Any]) -> Any:
    return node["events"][-1]


@pytest.fixture
def lead_and_helpers(make_app, plugin_module, tmp_path: Path):
    """``lead`` asks ``helper`` sub-agents; both scripted; the ``work`` tool counts runs."""

    def make(lead: list, helper: list, lead_limits: dict | None = None,
             helper_limits: dict | None = None, helper_model: str | None = None,
             plugins: tuple[str, ...] = (), **config: Any) -> tuple[App, Worker]:
        worker = Worker()
        agents = {
            "lead": {"model": _write_script(tmp_path, "lead", lead), "subagents": ["helper"],
                     **({"limits": lead_limits} if lead_limits else {})},
            "helper": {"model": helper_model or _write_script(tmp_path, "helper", helper),
                       **({"limits": helper_limits} if helper_limits else {})},
        }
        app = make_app(agent="lead", agents=agents,
                       load=[plugin_module(register_tools=worker.plugin()), *plugins],
                       **config)
        return app, worker

    return make


# --- parallel sub-agents ------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 2, 3, 4, 5, 6])
def test_parallel_subagents_make_exactly_the_parents_request_limit(lead_and_helpers, limit):
    """The reproduced defect: 4 ``ask_helper`` in one step under ``requests = 2`` made 5
    requests. The lead's own first request counts, so ``limit - 1`` helpers get one each."""
    app, _ = lead_and_helpers(
        lead=[{"tool_calls": _ask("helper", 4)}, {"text": "lead done"}],
        helper=[{"text": "helped", "delay": 0.05}],
        lead_limits={"requests": limit},
    )
    result = app.run("start")
    tree = _tree(app, result.session_id)
    helpers_ran = min(4, limit - 1)
    if limit == 6:  # 1 + 4 + the lead's answer
        assert (result.outcome, result.output) == ("completed", "lead done")
        assert _total(tree)["requests"] == 6
    else:
        assert result.outcome == "budget"
        assert result.reason == f"model requests limit reached ({limit}/{limit})"
        assert _total(tree)["requests"] == limit
    results = [e for e in tree["events"] if e.type == "tool/result"]
    assert len(results) == 4
    if limit == 1:  # the lead's own request used it up: its calls are never dispatched
        assert [r.status for r in results] == ["interrupted"] * 4
        assert tree["children"] == []
        return
    answered = [r for r in results if r.status == "ok"]
    assert [r.output for r in answered] == ["helped"] * helpers_ran
    refused = [r for r in results if r.status != "ok"]
    for r in refused:  # the model is told, in one clear sentence, why
        assert (r.status, r.output) == (
            "error", "sub-agent helper stopped by a budget limit before answering: model "
            f"requests limit reached in a parent run ({limit}/{limit})")
    for child in tree["children"]:
        end = _end(child)
        if _own(child)["requests"] == 0:
            assert (end.outcome, end.reason) == (
                "budget", f"model requests limit reached in a parent run ({limit}/{limit})")
        else:
            assert end.outcome == "completed"


def test_parallel_subagents_over_real_http_send_exactly_the_limit(lead_and_helpers, monkeypatch):
    """The same, measured where the bytes arrive: a loopback server counts the requests."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-budget-0123456789")
    with ScriptedServer() as server:
        server.script(*[Reply(body=openai_completion("helped"), delay=0.05)] * 4)
        app, _ = lead_and_helpers(
            lead=[{"tool_calls": _ask("helper", 4)}, {"text": "never"}],
            helper=[], lead_limits={"requests": 3}, helper_model="openai:helper-model",
            models={"openai:helper-model": {"base_url": server.url + "/v1",
                                            "retries": 0}},
        )
        result = app.run("start")
    assert (result.outcome, result.reason) == ("budget", "model requests limit reached (3/3)")
    assert len(server.received) == 2  # the lead's scripted request is the third
    tree = _tree(app, result.session_id)
    assert [_own(c)["requests"] for c in tree["children"]].count(1) == 2


def test_depth_three_parallel_fan_out_holds_the_root_request_limit(make_app, tmp_path):
    """top → 3× mid → 3× leaf each: 13 runs want 1 + 3·2 + 9 = 16 requests; the root allows
    7, and exactly 7 are made, wherever in the tree they landed."""
    agents = {
        "top": {"model": _write_script(tmp_path, "top", [
            {"tool_calls": _ask("mid", 3)}, {"text": "top done"}]),
            "subagents": ["mid"], "limits": {"requests": 7}},
        "mid": {"model": _write_script(tmp_path, "mid", [
            {"tool_calls": _ask("leaf", 3), "delay": 0.01}, {"text": "mid done"}]),
            "subagents": ["leaf"]},
        "leaf": {"model": _write_script(tmp_path, "leaf", [{"text": "leaf", "delay": 0.02}])},
    }
    app = make_app(agent="top", agents=agents)
    result = app.run("start")
    assert (result.outcome, result.reason) == ("budget", "model requests limit reached (7/7)")
    tree = _tree(app, result.session_id)
    assert _total(tree)["requests"] == 7
    for node in _nodes(tree)[1:]:
        end = _end(node)
        assert end.outcome in ("completed", "budget")
        if end.outcome == "budget":
            assert end.reason == "model requests limit reached in a parent run (7/7)"


def test_a_subagent_stopped_after_answering_returns_its_output_and_says_why(lead_and_helpers):
    app, worker = lead_and_helpers(
        lead=[{"tool_calls": _ask("helper", 1)}, {"text": "lead done"}],
        helper=[{"text": "partial answer", "tool_calls": _work(1)}, {"text": "never"}],
        helper_limits={"requests": 1},
    )
    result = app.run("start")
    assert (result.outcome, result.output) == ("completed", "lead done")
    tool_result = next(e for e in app.store.read(result.session_id) if e.type == "tool/result")
    assert (tool_result.status, tool_result.output) == (
        "ok", "partial answer\n[sub-agent helper stopped by a budget limit: model requests "
        "limit reached (1/1)]")
    assert worker.ran == []  # the request that used the budget up does not get its tools run


def test_app_parallel_inside_a_run_is_held_by_the_runs_budget(make_app, plugin_module,
                                                              tmp_path):
    """A tool that fans out with ``app.parallel`` does not escape its run's budget: the
    tasks are nested runs, chained to it."""
    holder: dict[str, App] = {}

    def fan_out() -> str:
        """Ask four helpers at once."""
        results = holder["app"].parallel([("helper", f"q{i}") for i in range(4)])
        return " | ".join(f"{r.outcome}: {r.output or r.reason}" for r in results)

    @hookimpl
    def register_tools(register):  # type: ignore[no-untyped-def]
        register(fan_out)

    agents = {
        "lead": {"model": _write_script(tmp_path, "lead", [
            {"tool_calls": [{"name": "fan_out", "arguments": {}}]}, {"text": "never"}]),
            "limits": {"requests": 3}},
        "helper": {"model": _write_script(tmp_path, "helper", [
            {"text": "helped", "delay": 0.05}])},
    }
    app = holder["app"] = make_app(agent="lead", agents=agents,
                                   load=[plugin_module(register_tools=register_tools)])
    result = app.run("start")
    assert (result.outcome, result.reason) == ("budget", "model requests limit reached (3/3)")
    output = next(e.output for e in app.store.read(result.session_id) if e.type == "tool/result")
    parts = output.split(" | ")
    assert sorted(parts) == ["budget: model requests limit reached in a parent run (3/3)"] * 2 \
        + ["completed: helped"] * 2
    infos = [app.store.info(i) for i in app.store.ids()]
    helper_sessions = [s for s in infos if s.agent == "helper"]
    assert len(helper_sessions) == 4
    assert all(s.parent == result.session_id for s in helper_sessions)


def test_parallel_first_runs_of_an_agent_share_one_adapter(make_app, plugin_module):
    """Parallel sub-agents of one name, started at the same moment on first use, get one
    Agent and one adapter: a run is bound to the adapter it recorded (C3), so two adapters
    built by a race failed a run with an invariant violation."""
    from dsh.llm.base import Model

    built: list[Any] = []

    class Slow(Model):
        def __init__(self, name, settings=None):  # type: ignore[no-untyped-def]
            time.sleep(0.05)  # a wide window for the race
            super().__init__(name, settings)
            built.append(self)

        def complete(self, request, on_text=None):  # type: ignore[no-untyped-def]
            raise AssertionError("not called")

    @hookimpl
    def register_models(register):  # type: ignore[no-untyped-def]
        register("slow", Slow)

    app = make_app(agents={"helper": {"model": "slow:x"}},
                   load=[plugin_module(register_models=register_models)])
    start = threading.Barrier(6)
    seen: list[Any] = []

    def first_use() -> None:
        start.wait()
        agent = app.agent("helper")
        seen.append((agent, agent.model))

    threads = [threading.Thread(target=first_use) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(a) for a, _ in seen}) == 1
    assert len({id(m) for _, m in seen}) == 1 and len(built) == 1


# --- parallel tool calls ----------------------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 2, 3, 4])
def test_parallel_tool_calls_run_in_call_order_up_to_the_limit(lead_and_helpers, limit):
    """The reproduced defect: ``tool_calls = 1`` with 3 calls in one step ran all 3. Calls
    reserve in call order before any is dispatched: the first ``limit`` run, the others get a
    ``budget`` result and the turn ends with outcome ``budget`` after the step."""
    app, worker = lead_and_helpers(
        lead=[{"tool_calls": _work(3, delay=0.02)}, {"text": "lead done"}], helper=[])
    result = app.run("start", limits=Limits(tool_calls=limit))
    assert sorted(worker.ran) == list(range(min(limit, 3)))
    events = app.store.read(result.session_id)
    results = [e for e in events if e.type == "tool/result"]
    assert [r.status for r in results] == ["ok"] * min(limit, 3) + ["budget"] * (3 - limit)
    for r in results[limit:]:
        assert r.output == f"not run: tool calls limit reached ({limit}/{limit})"
        assert r.duration_ms is None
    if limit == 4:
        assert (result.outcome, result.output) == ("completed", "lead done")
    else:
        assert (result.outcome, result.reason) == (
            "budget", f"tool calls limit reached ({limit}/{limit})")
        assert sum(e.type == "assistant/message" for e in events) == 1
    types = [e.type for e in events]
    assert types[-2:] == ["step/end", "turn/end"]  # the step closed normally, nothing dangles


def test_refused_tool_results_reach_the_model_as_errors(lead_and_helpers, tmp_path):
    """A resumed session shows the model which calls did not run and why."""
    app, _ = lead_and_helpers(lead=[{"tool_calls": _work(2)}, {"text": "ok"}], helper=[])
    first = app.run("start", limits=Limits(tool_calls=1))
    seen: list[Any] = []

    @hookimpl(wrapper=True)
    def request(call):  # type: ignore[no-untyped-def]
        seen.extend(call.request.messages)
        return (yield)

    app.pm.register(type("Spy", (), {"request": staticmethod(request)}), "spy")
    again = app.run("continue", session=first.session_id)
    assert again.outcome == "completed"
    tool_msgs = [m for m in seen if m.role == "tool"]
    assert [(m.is_error, m.content) for m in tool_msgs] == [
        (False, "worked 0"), (True, "not run: tool calls limit reached (1/1)")]


def test_parallel_sub_agents_and_their_tools_share_the_tool_call_limit(lead_and_helpers):
    """4 helpers at once, each calling 3 ``work`` in parallel, under the lead's
    ``tool_calls = 6``: the 4 ``ask_helper`` calls take 4 units, so exactly 2 ``work`` run."""
    app, worker = lead_and_helpers(
        lead=[{"tool_calls": _ask("helper", 4)}, {"text": "never"}],
        helper=[{"tool_calls": _work(3, delay=0.01), "delay": 0.02}, {"text": "helped"}],
        lead_limits={"tool_calls": 6},
    )
    result = app.run("start")
    assert (result.outcome, result.reason) == ("budget", "tool calls limit reached (6/6)")
    assert len(worker.ran) == 2
    tree = _tree(app, result.session_id)
    assert _total(tree)["tool_calls"] == 6
    not_run = [e for n in tree["children"] for e in n["events"]
               if e.type == "tool/result" and e.status not in ("ok", "error")]
    assert len(not_run) == 10
    # refused at reservation (a helper that was dispatching), or never dispatched (a helper
    # whose request resolved after the limit was reached) — which, depends on timing
    for e in not_run:
        assert (e.status, e.output) in (
            ("budget", "not run: tool calls limit reached in a parent run (6/6)"),
            ("interrupted", INTERRUPTED))


def test_a_driver_that_does_not_reserve_is_held_by_the_budget_layer(make_app, plugin_module):
    """``dsh.budget`` is essential: a replacement loop that dispatches tool calls itself
    (without the built-in loop's reservation) still cannot run more than the limit."""
    from dsh.core.messages import ToolCall
    from dsh.tools.registry import ToolInvocation

    worker = Worker()
    outputs: list[str] = []

    @hookimpl(tryfirst=True)
    def run_turn(turn):  # type: ignore[no-untyped-def]
        tool = turn.agent.tools["work"]
        for i in range(3):
            inv = ToolInvocation(ToolCall(id=f"c{i}", name="work", arguments={"i": i}), tool,
                                 {"i": i}, turn.agent.name)
            outputs.append(turn.pm.hook.execute(call=inv).output)
        return "completed"

    app = make_app(load=[plugin_module(register_tools=worker.plugin()),
                         plugin_module(run_turn=run_turn)])
    from dsh.core.errors import InputDroppedWarning

    with pytest.warns(InputDroppedWarning):  # the driver never took "x": reported (issue 23)
        result = app.run("x", model="echo", limits=Limits(tool_calls=1))
    assert result.outcome == "completed"
    assert worker.ran == [0]
    assert outputs[1:] == ["tool call blocked by dsh.budget: not run: tool calls limit "
                           "reached (1/1)"] * 2


# --- steps ------------------------------------------------------------------------------------


def test_parallel_subagents_hold_the_parents_step_limit(lead_and_helpers):
    app, _ = lead_and_helpers(
        lead=[{"tool_calls": _ask("helper", 4)}, {"text": "never"}],
        helper=[{"text": "helped", "delay": 0.02}],
        lead_limits={"steps": 3},
    )
    result = app.run("start")
    assert (result.outcome, result.reason) == ("budget", "steps limit reached (3/3)")
    tree = _tree(app, result.session_id)
    assert _total(tree)["steps"] == 3
    assert sorted(_own(c)["steps"] for c in tree["children"]) == [0, 0, 1, 1]


# --- tokens, cost and time: bounded by the calls in flight ------------------------------------


def _usage(n: int) -> dict[str, Any]:
    return {"usage": {"input_tokens": n, "output_tokens": n}}


class Gate:
    """The model ``gate:NAME`` for the helpers: each request waits until ``n`` requests are in
    flight at once (a barrier, so no request resolves before all have started — whatever the
    machine's speed), then runs ``on_release`` once and answers with ``usage`` tokens each way
    and, with ``work``, a ``work`` call (to show that nothing starts after a limit that was
    crossed before any request resolved)."""

    def __init__(self, n: int, usage: int, on_release: Callable[[], None] = lambda: None,
                 work: bool = False):
        self.barrier = threading.Barrier(n, action=on_release, timeout=20)
        self.started = 0
        self.lock = threading.Lock()
        self.usage = usage
        self.work = work

    def plugin(self) -> Any:
        from dsh.core.messages import ModelResponse
        from dsh.core.messages import ToolCall
        from dsh.core.messages import Usage
        from dsh.llm.base import Model

        gate = self

        class GateModel(Model):
            def complete(self, request, on_text=None):  # type: ignore[no-untyped-def]
                with gate.lock:
                    gate.started += 1
                gate.barrier.wait()
                return ModelResponse(
                    text="helped", usage=Usage(input_tokens=gate.usage,
                                               output_tokens=gate.usage),
                    tool_calls=(ToolCall(id="w", name="work", arguments={"i": 0}),)
                    if gate.work else ())

        @hookimpl
        def register_models(register):  # type: ignore[no-untyped-def]
            register("gate", GateModel)

        return register_models


@pytest.fixture
def gated(lead_and_helpers, plugin_module):
    def make(n: int, usage: int, lead_limits: dict, on_release=lambda: None,
             plugins: tuple[str, ...] = (), work: bool = False, **config: Any):
        gate = Gate(n, usage, on_release, work)
        app, worker = lead_and_helpers(
            lead=[{"tool_calls": _ask("helper", n)}, {"text": "never"}], helper=[],
            helper_model="gate:x", lead_limits=lead_limits,
            plugins=(plugin_module(register_models=gate.plugin()), *plugins), **config)
        return app, worker, gate

    return make


def test_token_overshoot_is_at_most_the_calls_in_flight(gated):
    """4 helpers start their request before any has resolved (nothing is spent yet), so all
    4 count: 400 tokens under a limit of 150 — the bound is one call per run with a request in
    flight below the level. The lead starts nothing after that."""
    app, worker, gate = gated(4, 50, {"total_tokens": 150})
    result = app.run("start")
    assert (result.outcome, result.reason) == ("budget", "total tokens limit reached (400/150)")
    assert gate.started == 4
    tree = _tree(app, result.session_id)
    assert [_own(c)["requests"] for c in tree["children"]] == [1, 1, 1, 1]
    assert _own(tree)["requests"] == 1
    assert result.usage.total_tokens == 400 <= 150 + 4 * 100
    for child in tree["children"]:  # each ends as its request resolves: at 100 tokens the
        end = _end(child)           # helper is done; at 200, 300 or 400 it is stopped
        if end.outcome != "completed":
            assert end.outcome == "budget"
            assert re.fullmatch(r"total tokens limit reached in a parent run \([234]00/150\)",
                                end.reason)


def test_token_overshoot_without_concurrency_is_one_call(lead_and_helpers):
    """One helper at a time, at depth 1: the limit is crossed by the call that resolves past
    it, and nothing starts after it."""
    app, _ = lead_and_helpers(
        lead=[{"tool_calls": _ask("helper", 1)}] * 4 + [{"text": "never"}],
        helper=[{"text": "helped", **_usage(50)}],
        lead_limits={"total_tokens": 150},
    )
    result = app.run("start")
    assert (result.outcome, result.reason) == ("budget", "total tokens limit reached (200/150)")
    assert result.usage.total_tokens == 200 < 150 + 100


def test_cost_overshoot_is_at_most_the_calls_in_flight(gated):
    app, worker, _ = gated(3, 500_000, {"cost": 1.0},
                           models={"gate:x": {"price": {"input": 1.0, "output": 1.0}}})
    result = app.run("start")
    # each helper call costs 0.5 + 0.5 = 1.0; all three were in flight before any resolved
    assert (result.outcome, result.reason) == ("budget", "cost limit reached (3.0000/1)")
    assert _total(_tree(app, result.session_id))["requests"] == 4


def test_time_limit_stops_new_units_and_lets_running_ones_finish(gated, plugin_module):
    """The lead's clock passes its deadline while 3 helper requests are in flight: they
    finish and are recorded, and no unit starts after them anywhere."""
    clock = Clock()

    @hookimpl
    def pre_step(step):  # type: ignore[no-untyped-def]
        from dsh.host.runcontext import context

        budget = context().budget
        if step.agent == "lead" and step.index == 0:
            budget.clock, budget.started = clock, clock.now  # the lead's time, controlled

    app, worker, gate = gated(3, 1, {"seconds": 60.0},
                              on_release=lambda: setattr(clock, "now", clock.now + 61),
                              plugins=(plugin_module(pre_step=pre_step),), work=True)
    result = app.run("start")
    assert (result.outcome, result.reason) == ("budget", "time limit reached (61.0s/60s)")
    assert gate.started == 3
    tree = _tree(app, result.session_id)
    for child in tree["children"]:
        assert _own(child) == {"requests": 1, "steps": 1, "tool_calls": 0}
        assert (_end(child).outcome, _end(child).reason) == (
            "budget", "time limit reached in a parent run (61.0s/60s)")
    assert worker.ran == []


def test_a_generous_time_limit_lets_a_run_finish(lead_and_helpers):
    app, worker = lead_and_helpers(
        lead=[{"tool_calls": _work(2)}, {"tool_calls": _ask("helper", 2)}, {"text": "done"}],
        helper=[{"text": "helped"}], lead_limits={"seconds": 3600.0},
        limits={"seconds": 3600.0})
    result = app.run("start")
    assert (result.outcome, result.output) == ("completed", "done")
    assert sorted(worker.ran) == [0, 1]


# --- the property: generated trees never exceed any level's limit -----------------------------


_LIMIT = st.one_of(st.none(), st.integers(1, 6))  # a limit is a positive integer


@st.composite
def trees(draw: Callable[..., Any]) -> list[dict[str, Any]]:
    """Levels of a run tree (root first): fan-out of sub-agents, plain tool calls per step,
    response delay, and optional limits on requests, tool calls and steps."""
    depth = draw(st.integers(1, 3))  # sub-agent levels below the root
    levels = []
    runs = 1
    for i in range(depth + 1):
        leaf = i == depth
        fan = 0 if leaf else draw(st.integers(1, 4))
        if runs * max(fan, 1) > 24:  # keep an example under ~a second on 2 cores
            fan = 1
        runs *= max(fan, 1)
        levels.append({
            "fan": fan,
            "work": draw(st.integers(0, 3)),
            "delay": draw(st.sampled_from([0.0, 0.0, 0.003, 0.01])),
            "steps": draw(st.integers(1, 2)),
            "limits": {k: v for k, v in (("requests", draw(_LIMIT)),
                                         ("tool_calls", draw(_LIMIT)),
                                         ("steps", draw(st.one_of(st.none(), st.integers(1, 4)))))
                       if v is not None},
        })
    return levels


def _level_app(levels: list[dict[str, Any]], folder: Path, worker: Worker,
               plugin: str) -> App:
    agents: dict[str, Any] = {}
    for i, level in enumerate(levels):
        calls = _work(level["work"], delay=level["delay"] / 2)
        if level["fan"]:
            calls = _ask(f"L{i + 1}", level["fan"]) + calls
        tool_step = {"tool_calls": calls, "delay": level["delay"]} if calls else None
        responses = [tool_step] * level["steps"] if tool_step else []
        responses.append({"text": f"L{i} done", "delay": level["delay"]})
        agent: dict[str, Any] = {"model": _write_script(folder, f"L{i}", responses)}
        if level["fan"]:
            agent["subagents"] = [f"L{i + 1}"]
        if level["limits"]:
            agent["limits"] = level["limits"]
        agents[f"L{i}"] = agent
    return App(config_from_dict({"autoload": False, "sessions_dir": str(folder / "sessions"),
                                 "agent": "L0", "agents": agents, "load": [plugin],
                                 "max_steps": 50}))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(levels=trees())
def test_generated_trees_never_exceed_any_levels_counted_limits(levels, plugin_module):
    """Every run of every level stays within its own request, tool-call and step limits,
    counting its whole subtree from the ledgers; a run stopped by its own counted limit used
    exactly that limit; the tool calls that really ran are the ones the ledgers record."""
    worker = Worker()
    plugin = plugin_module(register_tools=worker.plugin())
    with tempfile.TemporaryDirectory() as folder:
        app = _level_app(levels, Path(folder), worker, plugin)
        result = app.run("start")
        assert result.outcome in ("completed", "budget"), result.reason
        tree = _tree(app, result.session_id)
        nodes = _nodes(tree)
        names = {"requests": "model requests", "tool_calls": "tool calls", "steps": "steps"}
        for node in nodes:
            level = levels[int(node["agent"][1:])]
            total = _total(node)
            end = _end(node)
            assert end.outcome in ("completed", "budget"), end.reason
            for key, limit in level["limits"].items():
                assert total[key] <= limit, (node["agent"], key, total, levels)
                if end.reason == f"{names[key]} limit reached ({limit}/{limit})":
                    assert total[key] == limit  # exact: the limit, not fewer
        work_results = sum(e.type == "tool/result" and e.name == "work"
                           and e.status in ("ok", "error") for n in nodes for e in n["events"])
        assert len(worker.ran) == work_results


# --- Budget: reservations, wording, boundaries (unit) -----------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_reserve_adds_to_every_level_or_to_none():
    root = Budget(Limits(requests=5))
    mid = Budget(Limits(tool_calls=2), parent=root)
    leaf = Budget(Limits(), parent=mid)
    assert leaf.reserve(requests=1, tool_calls=1) is None
    assert (leaf.requests, mid.requests, root.requests) == (1, 1, 1)
    assert (leaf.tool_calls, mid.tool_calls, root.tool_calls) == (1, 1, 1)
    assert leaf.reserve(requests=1, tool_calls=2) == \
        "tool calls limit reached in a parent run (1/2)"
    assert (leaf.requests, mid.requests, root.requests) == (1, 1, 1)  # nothing taken
    assert leaf.reserve(requests=4, tool_calls=1) is None  # exactly up to both limits
    assert (root.requests, mid.tool_calls) == (5, 2)
    assert leaf.reserve(requests=1) == "tool calls limit reached in a parent run (2/2)"
    assert root.reserve(requests=1) == "model requests limit reached (5/5)"
    assert root.reserve(steps=1) == "model requests limit reached (5/5)"  # any limit reached


def test_reserve_refuses_when_the_count_would_pass_the_limit():
    b = Budget(Limits(requests=3))
    assert b.reserve(requests=2) is None
    assert b.reserve(requests=2) == "model requests limit reached (2/3)"
    assert b.requests == 2
    assert b.reserve(requests=1) is None
    assert b.exceeded() == "model requests limit reached (3/3)"


@pytest.mark.parametrize("key,name", [("steps", "steps"), ("requests", "model requests"),
                                      ("tool_calls", "tool calls")])
def test_own_limit_and_a_parents_are_reported_distinctly(key, name):
    parent = Budget(Limits(**{key: 1}))
    child = Budget(Limits(**{key: 1}), parent=parent)
    assert child.reserve(**{key: 1}) is None
    own, inherited = f"{name} limit reached (1/1)", f"{name} limit reached in a parent run (1/1)"
    assert child.exceeded() == own and parent.exceeded() == own
    other = Budget(Limits(), parent=parent)
    assert other.exceeded() == inherited
    assert other.reserve(**{key: 1}) == inherited
    assert own not in inherited and inherited not in own  # no substring assert can confuse them


def test_a_grandparents_limit_is_reported_as_a_parents():
    root = Budget(Limits(steps=1))
    leaf = Budget(Limits(), parent=Budget(Limits(), parent=root))
    assert leaf.reserve(steps=1) is None
    assert leaf.exceeded() == "steps limit reached in a parent run (1/1)"


def test_reservations_from_many_threads_are_exact():
    root = Budget(Limits(requests=500))
    children = [Budget(Limits(requests=40), parent=root) for _ in range(16)]
    granted = [0] * 16
    start = threading.Barrier(16)

    def hammer(i: int) -> None:
        start.wait()
        for _ in range(100):
            if children[i].reserve(requests=1) is None:
                granted[i] += 1

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(granted) == root.requests == 500  # 16 × 40 = 640 wanted
    assert all(g == c.requests <= 40 for g, c in zip(granted, children, strict=True))


def test_add_is_exact_from_many_threads():
    root = Budget()
    child = Budget(parent=root)

    def spend() -> None:
        for _ in range(5000):
            child.add(input_tokens=1, cost=0.5)

    threads = [threading.Thread(target=spend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (child.input_tokens, root.input_tokens) == (40_000, 40_000)
    assert (child.cost, root.cost) == (20_000.0, 20_000.0)


@pytest.mark.parametrize("limits,spend,reason", [
    (Limits(input_tokens=10), {"input_tokens": 9}, None),
    (Limits(input_tokens=10), {"input_tokens": 10}, "input tokens limit reached (10/10)"),
    (Limits(output_tokens=10), {"output_tokens": 10}, "output tokens limit reached (10/10)"),
    (Limits(total_tokens=10), {"input_tokens": 4, "output_tokens": 5}, None),
    (Limits(total_tokens=10), {"input_tokens": 5, "output_tokens": 5},
     "total tokens limit reached (10/10)"),
    (Limits(cost=3.0), {"cost": 2.9999}, None),
    (Limits(cost=3.0), {"cost": 3.0}, "cost limit reached (3.0000/3)"),
    (Limits(cost=0.25), {"cost": 0.5}, "cost limit reached (0.5000/0.25)"),
])
def test_spent_limits_are_reached_at_the_limit_not_after(limits, spend, reason):
    b = Budget(limits)
    b.add(**spend)
    assert b.exceeded() == reason
    assert b.reserve(requests=1) == reason
    assert b.requests == (0 if reason else 1)


def test_time_limit_boundary_and_a_generous_limit():
    clock = Clock()
    b = Budget(Limits(seconds=10), clock=clock)
    assert b.started == 1000.0
    clock.now = 1009.99
    assert b.exceeded() is None and b.reserve(steps=1) is None
    clock.now = 1010.0
    assert b.exceeded() == "time limit reached (10.0s/10s)"
    assert b.reserve(steps=1) == "time limit reached (10.0s/10s)"
    child = Budget(Limits(seconds=3600), parent=b, clock=clock)
    assert child.exceeded() == "time limit reached in a parent run (10.0s/10s)"
    clock.now = 1000.0 + 3599
    assert Budget(Limits(seconds=3600), clock=lambda: clock.now - 3599).exceeded() is None


def test_budget_exceeded_is_a_limit_error():
    err = BudgetExceeded("model requests limit reached (1/1)")
    assert isinstance(err, DshError) and err.exit_code == EXIT_LIMIT == 3


def test_a_request_that_cannot_reserve_is_not_sent(make_app, plugin_module):
    """A request reserves before it is sent: when the chain has none left (here a plugin's
    request wrapper spent the last one after the step's check), the turn ends with outcome
    ``budget`` and the model is never called."""
    from dsh.core.messages import ModelResponse
    from dsh.host.runcontext import context
    from dsh.llm.base import Model

    calls: list[Any] = []

    class Counting(Model):
        def complete(self, request, on_text=None):  # type: ignore[no-untyped-def]
            calls.append(request)
            return ModelResponse(text="answered")

    @hookimpl
    def register_models(register):  # type: ignore[no-untyped-def]
        register("counting", Counting)

    @hookimpl(wrapper=True, tryfirst=True)
    def request(call):  # type: ignore[no-untyped-def]
        assert context().budget.reserve(requests=1) is None
        return (yield)

    app = make_app(load=[plugin_module(register_models=register_models),
                         plugin_module(request=request)])
    result = app.run("hello", model="counting:x", limits=Limits(requests=1))
    assert (result.outcome, result.reason) == ("budget", "model requests limit reached (1/1)")
    assert calls == []
    events = app.store.read(result.session_id)
    assert [e.type for e in events] == [
        "turn/start", "step/start", "user/message", "step/end", "turn/end"]
    again = app.run("hello", model="counting:x", limits=Limits(requests=2))  # 1 for the plugin
    assert (again.outcome, again.output, len(calls)) == ("completed", "answered", 1)


# --- CancelToken and cleanups (mutation gaps) -------------------------------------------------


def test_on_cancel_unregister_removes_only_that_callback():
    token = CancelToken()
    called: list[str] = []
    off = token.on_cancel(lambda: called.append("removed"))
    token.on_cancel(lambda: called.append("kept"))
    off()
    off()  # twice is harmless
    token.cancel("stop")
    assert called == ["kept"]
    assert token.cancelled and token.reason == "stop"
    late = token.on_cancel(lambda: called.append("late"))  # fires at once once cancelled
    assert called == ["kept", "late"]
    late()
    token.cancel("again")  # fires once only
    assert called == ["kept", "late"] and token.reason == "stop"


def test_child_token_follows_its_parent_once():
    parent = CancelToken()
    child = CancelToken(parent)
    seen: list[str] = []
    child.on_cancel(lambda: seen.append(child.reason))
    parent.cancel("caller gave up")
    assert child.cancelled and seen == ["caller gave up"]
    with pytest.raises(DshError, match="run aborted: caller gave up"):
        child.check()


def test_run_cleanups_runs_all_in_reverse_and_returns_the_errors():
    ctx = RunContext(run_id="r", agent="a", ledger=None)  # type: ignore[arg-type]
    order: list[str] = []
    first, second = ValueError("one"), KeyError("two")

    def raise_(exc: BaseException) -> Callable[[], None]:
        def fn() -> None:
            order.append(str(exc))
            raise exc
        return fn

    ctx.add_cleanup(lambda: order.append("a"))
    ctx.add_cleanup(raise_(first))
    ctx.add_cleanup(lambda: order.append("b"))
    ctx.add_cleanup(raise_(second))
    errors = ctx.run_cleanups()
    assert errors == [second, first]
    assert order == [str(second), "b", "one", "a"]
    assert ctx.run_cleanups() == []  # each runs once
