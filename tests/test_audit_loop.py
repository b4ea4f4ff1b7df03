"""Issue 9, section 3: the loop's edges a hostile review found (B2, B3, B4, D7).

- ``turn_stopping`` is called every time the turn is about to stop, whatever the bound.
- An observer plugin registered during an unobserved run warns (it cannot receive anything).
- Empty or whitespace-only input is no input: no request, the turn still closes, injected
  context keeps waiting; a ``pre_step`` rewriting the message to whitespace rejects the step.
- ``step/rejected`` names the plugin that rejected, from its registration.
- Mid-turn input (steering): ``Session.steer`` from another thread, taken at the next step
  boundary of the running turn, never lost.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.core.errors import InputDroppedWarning
from dsh.core.errors import SessionInUse
from dsh.hookspecs import hookimpl
from dsh.host.runcontext import UnobservedRunWarning
from dsh.llm.builtin import ScriptedModel
from dsh.run.app import App
from dsh.run.loop import Inbox
from dsh.run.session import Session
from tests.conftest import ledger_types

#: Every character ``str.strip()`` removes (exactly the ``str.isspace()`` ones). Zero-width
#: characters such as U+200B are not among them: text made of them is a message.
WHITESPACE = [chr(i) for i in range(sys.maxunicode + 1) if chr(i).isspace()]


def types_of(session: Session) -> list[str]:
    assert session.ledger.path is not None
    return ledger_types(session.ledger.path)


def scripted(session: Session, *responses: dict[str, Any]) -> ScriptedModel:
    """Give ``session``'s agent a scripted model (the adapter is built per agent)."""
    model = ScriptedModel("", {"responses": list(responses)})
    session.agent._model = model
    return model


# --- B2: turn_stopping is called every time the turn is about to stop ------------------------


@pytest.mark.parametrize("bound", [0, 1, 2])
def test_turn_stopping_is_called_every_time_even_past_the_bound(make_app, plugin_module,
                                                               bound: int) -> None:
    asked: list[tuple[int, int]] = []

    @hookimpl
    def turn_stopping(turn):  # type: ignore[no-untyped-def]
        asked.append((turn.steps, turn.continuations))
        return "one more"

    live: list[Any] = []
    app = make_app(load=[plugin_module(turn_stopping=turn_stopping)], max_continuations=bound)
    result = app.run("start", model="echo", on_event=live.append)
    assert result.outcome == "completed"
    # asked once per step: bound times taken, then once more, past the bound, not taken
    assert asked == [(n + 1, n) for n in range(bound + 1)]
    assert [e.data["steps"] for e in live if e.type == "agent/turn-stopping"] == [
        n + 1 for n in range(bound + 1)]
    events = app.store.read(result.session_id)
    assert [e.text for e in events if e.type == "user/message"] == (  # type: ignore[attr-defined]
        ["start"] + ["one more"] * bound)
    assert events[-1].reason == result.reason  # type: ignore[attr-defined]
    assert result.reason.startswith(f"continuation limit reached ({bound}): the follow-up "
                                    "from plugin:dsh_test_plugin_")
    assert result.reason.endswith("was not taken")


def test_turn_stopping_without_an_answer_leaves_no_reason(make_app, plugin_module) -> None:
    asked = []

    @hookimpl
    def turn_stopping(turn):  # type: ignore[no-untyped-def]
        asked.append(turn.steps)

    app = make_app(load=[plugin_module(turn_stopping=turn_stopping)], max_continuations=0)
    result = app.run("hi", model="echo")
    assert (result.outcome, result.reason, asked) == ("completed", "", [1])


# --- D7: an observer plugin registered during an unobserved run warns -------------------------


class LateObserver:
    def __init__(self) -> None:
        self.got: list[Any] = []

    @hookimpl
    def observe_event(self, event: Any) -> None:
        self.got.append(event)


def test_observer_plugin_registered_during_unobserved_run_warns(make_app, plugin_module,
                                                                script) -> None:
    late = LateObserver()
    box: dict[str, Session] = {}

    @hookimpl
    def pre_step(step):  # type: ignore[no-untyped-def]
        pm = box["s"].agent.pm
        if pm.get_plugin("late_observer") is None:
            pm.register(late, name="late_observer")

    app = make_app(load=[plugin_module(pre_step=pre_step)])
    with app.session(model=script({"text": "one"}, {"text": "two"})) as s:
        box["s"] = s
        with pytest.warns(UnobservedRunWarning, match="late_observer was registered during"):
            first = s.send("hi")
        assert first.outcome == "completed" and first.output == "one"
        assert late.got == []  # the run builds no events: nothing to deliver
        second = s.send("again")  # the next run sees the plugin: observed from the start
    assert second.output == "two", (second.outcome, second.reason)
    assert [e.type for e in late.got if e.type == "turn/start"] == ["turn/start"]
    assert "llm/stream" in [e.type for e in late.got]


def test_observer_plugin_registered_during_observed_run_receives_from_next_boundary(
        make_app, plugin_module, script) -> None:
    late = LateObserver()
    box: dict[str, Session] = {}

    @hookimpl
    def pre_step(step):  # type: ignore[no-untyped-def]
        pm = box["s"].agent.pm
        if pm.get_plugin("late_observer") is None:
            pm.register(late, name="late_observer")

    app = make_app(load=[plugin_module(pre_step=pre_step)])
    with app.session(model=script({"text": "one"})) as s:
        box["s"] = s
        result = s.send("hi", observe=True)  # observed: no warning (filterwarnings = error)
    assert result.outcome == "completed"
    assert [e.type for e in late.got] == ["agent/turn-stopping", "turn/end"]


# --- B3/B4: whitespace-only input is empty ----------------------------------------------------


def test_inject_then_empty_send_makes_no_request_and_context_waits(make_app, script) -> None:
    app = make_app()
    with app.session(model=script({"text": "answer"})) as s:
        s.inject("the build is green", source="ci")
        empty = s.send("")
        assert (empty.outcome, empty.steps, empty.output) == ("completed", 0, "")
        assert "no input" in empty.reason
        assert types_of(s) == ["turn/start", "turn/end"]  # closed and logged, nothing sent
        assert len(s.inbox) == 1 and s.pending == 0  # the context waits for a real message
        real = s.send("status?")
    assert real.output == "answer"
    assert ledger_types(real.path)[2:6] == [  # type: ignore[arg-type]
        "turn/start", "step/start", "context/injected", "user/message"]


def test_zero_width_text_is_a_message(make_app, script) -> None:
    app = make_app()
    result = app.run("\u200b", model=script({"text": "seen"}))
    assert (result.outcome, result.output) == ("completed", "seen")


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blank=st.text(alphabet=st.sampled_from(WHITESPACE), max_size=6))
def test_whitespace_only_message_sends_nothing(make_app, blank: str) -> None:
    app = make_app()
    with app.session(model="echo") as s:
        s.inject("context")
        result = s.send(blank)
        assert (result.outcome, result.steps) == ("completed", 0)
        assert types_of(s) == ["turn/start", "turn/end"]
        assert len(s.inbox) == 1  # the context still waits
        with pytest.warns(InputDroppedWarning, match="context from api"):
            s.close()  # … and closing the session says it was never sent (issue 23)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blank=st.text(alphabet=st.sampled_from(WHITESPACE), max_size=6))
def test_pre_step_rewriting_to_whitespace_rejects(make_app, plugin_module, blank: str) -> None:
    @hookimpl
    def pre_step(step):  # type: ignore[no-untyped-def]
        step.text = blank

    name = plugin_module(pre_step=pre_step)
    app = make_app(load=[name])
    with app.session(model="echo") as s:
        s.inject("context stays out of it")
        result = s.send("hello")
        assert (result.outcome, result.reason) == ("rejected", "input rewritten to empty")
        assert types_of(s) == ["turn/start", "step/rejected", "turn/end"]
        rejected = s.ledger.projection  # nothing of the step reaches the history
        assert len(rejected) == 0
        assert len(s.inbox) == 1  # the context waits for the next step (issue 23)
        with pytest.warns(InputDroppedWarning):
            s.close()
    [event] = [e for e in app.store.read(result.session_id) if e.type == "step/rejected"]
    assert event.plugin == name and event.text == "hello"  # type: ignore[attr-defined]


# --- step/rejected names the plugin from its registration -------------------------------------


def test_rejection_is_attributed_to_the_rejecting_plugin(make_app, plugin_module) -> None:
    seen: list[str] = []

    @hookimpl
    def bystander(step):  # type: ignore[no-untyped-def]
        seen.append("bystander")
        step.text = step.text.upper()

    @hookimpl
    def rejecter(step):  # type: ignore[no-untyped-def]
        seen.append("rejecter")
        step.reject("not today", plugin="bystander-impersonated")  # the claim is ignored

    @hookimpl
    def never(step):  # type: ignore[no-untyped-def]
        seen.append("never")

    # pluggy calls the last registered first: never is registered first, so it runs last
    names = [plugin_module(pre_step=never), plugin_module(pre_step=rejecter),
             plugin_module(pre_step=bystander)]
    app = make_app(load=names)
    result = app.run("hi", model="echo")
    assert (result.outcome, result.reason) == ("rejected", "not today")
    assert seen == ["bystander", "rejecter"]  # the first rejection wins: no later impl runs
    [event] = [e for e in app.store.read(result.session_id) if e.type == "step/rejected"]
    assert event.plugin == names[1]  # type: ignore[attr-defined]


def test_rewrite_to_empty_is_attributed_and_a_restored_text_runs(make_app,
                                                                 plugin_module) -> None:
    @hookimpl
    def emptier(step):  # type: ignore[no-untyped-def]
        step.text = "   "

    @hookimpl
    def plain(step):  # type: ignore[no-untyped-def]
        pass

    names = [plugin_module(pre_step=plain), plugin_module(pre_step=emptier)]
    result = make_app(load=names).run("hi", model="echo")
    assert result.outcome == "rejected"
    assert ledger_types(result.path)[1] == "step/rejected"  # type: ignore[arg-type]
    events = [line for line in result.path.read_text().splitlines()]  # type: ignore[union-attr]
    assert f'"plugin":"{names[1]}"' in events[1].replace(" ", "")


def test_pre_step_wrapper_is_refused_naming_the_plugin(make_app, plugin_module) -> None:
    @hookimpl(wrapper=True)
    def pre_step(step):  # type: ignore[no-untyped-def]
        return (yield)

    name = plugin_module(pre_step=pre_step)
    result = make_app(load=[name]).run("hi", model="echo")
    assert result.outcome == "error"
    assert result.reason.startswith(f"plugin {name}: hook pre_step cannot be wrapped")


def test_pre_step_setting_text_to_none_is_named(make_app, plugin_module) -> None:
    @hookimpl
    def pre_step(step):  # type: ignore[no-untyped-def]
        step.text = None

    name = plugin_module(pre_step=pre_step)
    result = make_app(load=[name]).run("hi", model="echo")
    assert result.outcome == "error"
    assert f"plugin {name} set step.text to a NoneType in hook pre_step" in result.reason


# --- mid-turn input: steering ------------------------------------------------------------------


def gated_tool(started: threading.Event, release: threading.Event) -> Callable[..., str]:
    def gate() -> str:
        """Wait until the test says so."""
        started.set()
        assert release.wait(10)
        return "opened"

    return gate


def test_steer_from_another_thread_is_taken_at_the_next_step(make_app, plugin_module,
                                                              script) -> None:
    started, release = threading.Event(), threading.Event()
    gate = gated_tool(started, release)

    @hookimpl
    def register_tools(register):  # type: ignore[no-untyped-def]
        register(gate)

    app = make_app(load=[plugin_module(register_tools=register_tools)])
    with app.session(model=script({"tool_calls": [{"name": "gate", "arguments": {}}]},
                                  {"text": "steered answer"})) as s:
        answer: dict[str, Any] = {}

        def steerer() -> None:
            assert started.wait(10)  # the tool is running: the turn is mid-step
            answer["taken"] = s.steer("also check the tests")
            try:
                s.send("a second turn?")
            except SessionInUse as exc:
                answer["in_use"] = str(exc)
            release.set()

        t = threading.Thread(target=steerer)
        t.start()
        result = s.send("open the gate")
        t.join()
        assert s.pending == 0
    assert answer["taken"] is True
    assert "Session.steer" in answer["in_use"]
    assert result.outcome == "completed" and result.output == "steered answer"
    assert result.steps == 2
    assert ledger_types(result.path) == [  # type: ignore[arg-type]
        "turn/start", "step/start", "user/message", "assistant/message", "tool/call",
        "tool/result", "step/end",
        "step/start", "user/message", "assistant/message", "step/end", "turn/end"]
    events = app.store.read(result.session_id)
    users = [(e.text, e.source) for e in events if e.type == "user/message"]  # type: ignore[attr-defined]
    assert users == [("open the gate", "user"), ("also check the tests", "user")]
    with app.store.open(result.session_id) as ledger:
        roles = [m.role for m in ledger.projection.view()]
    assert roles == ["user", "assistant", "tool", "user", "assistant"]


def test_steer_during_a_slow_response_runs_another_step(make_app, plugin_module) -> None:
    asked, steered = threading.Event(), threading.Event()

    @hookimpl(wrapper=True)
    def request(call):  # type: ignore[no-untyped-def]
        if not asked.is_set():  # the first response is slow: it waits for the steering
            asked.set()
            assert steered.wait(10)
        return (yield)

    app = make_app(load=[plugin_module(request=request)])
    with app.session() as s:
        scripted(s, {"text": "first"}, {"text": "second"})
        taken: list[bool] = []

        def steerer() -> None:
            assert asked.wait(10)  # the model is answering the first request
            taken.append(s.steer("and one more thing"))
            steered.set()

        t = threading.Thread(target=steerer)
        t.start()
        result = s.send("slow question")
        t.join()
    assert taken == [True]
    assert (result.output, result.steps) == ("second", 2)
    events = app.store.read(result.session_id)
    assert [e.type for e in events] == [
        "turn/start", "step/start", "user/message", "assistant/message", "step/end",
        "step/start", "user/message", "assistant/message", "step/end", "turn/end"]
    assert [e.text for e in events if e.type == "user/message"] == [  # type: ignore[attr-defined]
        "slow question", "and one more thing"]


def test_steer_while_the_turn_is_stopping_still_gets_a_step(make_app, plugin_module) -> None:
    box: dict[str, Any] = {"taken": []}

    @hookimpl
    def turn_stopping(turn):  # type: ignore[no-untyped-def]
        if not box["taken"]:  # the turn has decided no work is due: steer now, from a thread
            t = threading.Thread(target=lambda: box["taken"].append(box["s"].steer("wait!")))
            t.start()
            t.join()

    app = make_app(load=[plugin_module(turn_stopping=turn_stopping)], max_continuations=0)
    with app.session(model="echo") as s:
        box["s"] = s
        result = s.send("done?")
        assert s.pending == 0
    assert box["taken"] == [True]
    assert (result.output, result.steps) == ("wait!", 2)


def test_steer_after_the_turn_stopped_waits_for_the_next_send(make_app) -> None:
    app = make_app()
    with app.session(model="echo") as s:
        late: list[bool] = []

        def on_event(event: Any) -> None:
            if event.type == "turn/end":  # the turn is closing: too late for it
                t = threading.Thread(target=lambda: late.append(s.steer("too late")))
                t.start()
                t.join()

        first = s.send("hi", on_event=on_event)
        assert late == [False] and s.pending == 1  # not lost: waiting, and the caller can tell
        assert first.steps == 1
        second = s.send("")  # runs a turn on what waits
        assert s.pending == 0
    assert (second.output, second.steps) == ("too late", 1)


def test_steered_message_survives_a_turn_ending_on_budget(make_app, plugin_module,
                                                          script) -> None:
    started, release = threading.Event(), threading.Event()
    gate = gated_tool(started, release)

    @hookimpl
    def register_tools(register):  # type: ignore[no-untyped-def]
        register(gate)

    app = make_app(load=[plugin_module(register_tools=register_tools)], max_steps=1)
    with app.session(model=script({"tool_calls": [{"name": "gate", "arguments": {}}]},
                                  {"text": "read it"}, {"text": "and the next"})) as s:
        taken: list[bool] = []

        def steerer() -> None:
            assert started.wait(10)
            taken.append(s.steer("steered"))
            release.set()

        t = threading.Thread(target=steerer)
        t.start()
        first = s.send("go")
        t.join()
        assert first.outcome == "budget" and taken == [True]
        assert s.pending == 1  # the turn ended before its next boundary: still waiting
        second = s.send("next")
    # the waiting message first, then the new one, each in its own step (max_steps=1 per turn)
    users = [e.text for e in app.store.read(second.session_id)  # type: ignore[attr-defined]
             if e.type == "user/message"]
    assert users == ["go", "steered"]
    assert second.outcome == "budget"  # one step per turn: "next" waits in turn
    # closing the session reports it (its turn's outcome said so: no warning; issue 23)
    assert s.pending == 0 and [i.text for i in s.dropped] == ["next"]


def test_an_aborted_turn_gives_its_steered_message_back(make_app, plugin_module,
                                                        script) -> None:
    started, release = threading.Event(), threading.Event()
    gate = gated_tool(started, release)

    @hookimpl
    def register_tools(register):  # type: ignore[no-untyped-def]
        register(gate)

    app = make_app(load=[plugin_module(register_tools=register_tools)])
    handle: dict[str, Any] = {}
    with app.session(model=script({"tool_calls": [{"name": "gate", "arguments": {}}]},
                                  {"text": "never"})) as s:
        s.inject("context for the next message")

        def steerer() -> None:
            assert started.wait(10)
            handle["taken"] = s.steer("wait, one more thing")
            handle["ctx"].abort("user pressed Esc")  # the turn ends at its next boundary
            release.set()

        t = threading.Thread(target=steerer)
        t.start()
        result = s.send("go", context_hook=lambda ctx: handle.setdefault("ctx", ctx))
        t.join()
        assert result.outcome == "aborted" and handle["taken"] is True
        assert s.pending == 1  # taken at the boundary, never recorded: given back
        assert s.withdraw() == ["wait, one more thing"]  # e.g. back into a chat's input box
        assert s.pending == 0 and len(s.inbox) == 0  # the context went with "go"
    events = app.store.read(result.session_id)
    assert "wait, one more thing" not in [getattr(e, "text", None) for e in events]


def test_withdraw_keeps_context(make_app) -> None:
    app = make_app()
    with app.session(model="echo") as s:
        s.inject("ctx")
        assert s.steer("a") is False and s.steer("b") is False  # no turn running: waiting
        assert (s.pending, s.withdraw(), s.pending, len(s.inbox)) == (2, ["a", "b"], 0, 1)
        with pytest.warns(InputDroppedWarning, match="context from api"):
            s.close()  # the context never sent is reported (issue 23)


def test_blank_steer_queues_nothing(make_app) -> None:
    app = make_app()
    with app.session(model="echo") as s:
        assert [s.steer(blank) for blank in ("", " ", "\u3000\n")] == [False] * 3
        assert s.pending == 0 and len(s.inbox) == 0


def test_inbox_is_thread_safe_and_keeps_each_threads_order() -> None:
    inbox = Inbox()
    inbox.open()
    per_thread = 300

    def producer(k: int) -> None:
        for i in range(per_thread):
            if i % 3 == 0:
                inbox.inject(f"{k}:{i}")
            else:
                assert inbox.put(f"{k}:{i}")

    taken: list[str] = []
    threads = [threading.Thread(target=producer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    while inbox.awake:
        context, message = inbox.take()
        assert message is not None
        taken.extend(c.text for c in context)
        taken.append(message.text)
    assert inbox.messages == 0
    leftover, none = inbox.take(close=True)
    assert (leftover, none) == ([], None)
    taken.extend(i.text for i in inbox._items)  # trailing context stays in the inbox
    assert sorted(taken) == sorted(f"{k}:{i}" for k in range(4) for i in range(per_thread))
    for k in range(4):
        mine = [int(x.split(":")[1]) for x in taken if x.startswith(f"{k}:")]
        assert mine == sorted(mine)
    assert inbox.put("after close") is False  # no turn takes it: it waits for the next


def test_app_helper_builds_sessions(tmp_path) -> None:
    """The API the steering tests rely on, without fixtures: App.from_config + session."""
    app = App.from_config({"autoload": False, "sessions_dir": str(tmp_path / "s")})
    with app.session(model="echo") as s:
        assert s.steer("queued before any turn") is False and s.pending == 1
        result = s.send("")
    assert result.output == "queued before any turn"
