"""The chat chain: invariant C3, wrappers as onion layers, rescue, built-in models."""

from __future__ import annotations

import threading

import attrs
import pytest

from dsh.core.errors import InvariantViolation
from dsh.core.messages import Message
from dsh.core.messages import ModelRequest
from dsh.hookspecs import hookimpl
from dsh.host.runcontext import context
from dsh.ledger.history import Projection
from dsh.llm.builtin import EchoModel
from dsh.llm.builtin import ScriptedModel
from dsh.llm.builtin import check_invariant
from dsh.llm.transport import send


class Smuggler:
    """Adds text to the request without writing it to the ledger: C3 must catch it."""

    @hookimpl(wrapper=True)
    def request(self, call):  # type: ignore[no-untyped-def]
        msgs = list(call.request.messages) + [Message(role="user", content="psst")]
        call.request = attrs.evolve(call.request, messages=msgs)
        return (yield)


def test_smuggled_text_fails_loudly(make_app, plugin_module):
    s = Smuggler()
    app = make_app(load=[plugin_module(request=s.request)])
    result = app.run("hello", model="echo")
    assert result.outcome == "error"
    assert isinstance(result.error, InvariantViolation)
    assert "invariant C3 violated" in result.reason
    assert "messages differ (2 sent, 1 in the ledger)" in result.reason
    events = app.store.read(result.session_id)
    assert events[-1].outcome == "error"  # type: ignore[attr-defined]
    assert "psst" not in result.path.read_text()


def test_smuggled_system_prompt_fails_loudly(make_app, plugin_module):
    @hookimpl(wrapper=True)
    def request(call):  # type: ignore[no-untyped-def]
        call.request = attrs.evolve(call.request, system="secret instructions")
        return (yield)

    result = make_app(load=[plugin_module(request=request)]).run("hi", model="echo")
    assert "system prompt differs" in result.reason


def test_rebuilt_but_equal_request_passes(make_app, plugin_module):
    @hookimpl(wrapper=True)
    def request(call):  # type: ignore[no-untyped-def]
        call.request = attrs.evolve(call.request, messages=tuple(call.request.messages))
        return (yield)

    result = make_app(load=[plugin_module(request=request)]).run("hi", model="echo")
    assert result.outcome == "completed"


def test_check_invariant_identity_fast_path():
    p = Projection()
    req = ModelRequest(model="", messages=p.view())
    check_invariant(req, p)  # same list, same length: no comparison needed
    from dsh.ledger.events import UserMessage

    p.apply(UserMessage(text="x"))
    with pytest.raises(InvariantViolation):
        check_invariant(req, p)  # the request is now stale


def test_request_wrappers_onion_and_budget(make_app, plugin_module):
    order = []

    class Outer:
        @hookimpl(wrapper=True, tryfirst=True)
        def request(self, call):  # type: ignore[no-untyped-def]
            order.append("outer-in")
            response = yield
            order.append(("outer-out", context().budget.requests))
            return attrs.evolve(response, text=response.text + "!")

    class Mid:
        @hookimpl(wrapper=True)
        def request(self, call):  # type: ignore[no-untyped-def]
            order.append("mid-in")
            response = yield
            order.append(("mid-out", context().budget.requests))
            return response

    app = make_app(load=[plugin_module(request=Mid().request),
                         plugin_module(request=Outer().request)])
    result = app.run("hi", model="echo")
    # budget counting is a built-in wrapper: counted before plugin wrappers see the response
    assert order == ["outer-in", "mid-in", ("mid-out", 1), ("outer-out", 1)]
    assert result.output == "hi!"  # what the outer layer returned is what is logged
    assert app.store.read(result.session_id)[3].text == "hi!"  # type: ignore[attr-defined]


def test_text_tool_call_reaches_rescue(make_app, plugin_module, script):
    def weather(city: str) -> str:
        """Weather for a city."""
        return f"sunny in {city}"

    @hookimpl
    def register_tools(register):  # type: ignore[no-untyped-def]
        register(weather)

    app = make_app(load=[plugin_module(register_tools=register_tools)])
    text = ('Let me check.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}'
            "\n</tool_call>")
    result = app.run("weather?", model=script({"text": text}, {"text": "It is sunny."}))
    assert result.outcome == "completed"
    events = app.store.read(result.session_id)
    first = events[3]
    assert first.tool_call_source == "hermes"  # type: ignore[attr-defined]
    assert first.text == "Let me check."  # type: ignore[attr-defined]
    assert first.tool_calls[0].arguments == {"city": "Paris"}  # type: ignore[attr-defined]
    assert [e for e in events if e.type == "tool/result"][0].output == "sunny in Paris"  # type: ignore[attr-defined]


def test_streamed_tool_call_text_is_not_shown(make_app, plugin_module, script):
    def weather(city: str) -> str:
        """W."""
        return "sunny"

    @hookimpl
    def register_tools(register):  # type: ignore[no-untyped-def]
        register(weather)

    app = make_app(load=[plugin_module(register_tools=register_tools)])
    shown: list[str] = []
    text = 'Checking. <tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'
    with app.session(model=script({"text": text}, {"text": "It is sunny."})) as s:
        result = s.send("weather?", on_text=shown.append)
    assert result.outcome == "completed"
    assert "".join(shown) == "Checking.It is sunny."
    assert "tool_call" not in "".join(shown)


def test_echo_answers_last_message_and_streams():
    parts: list[str] = []
    req = ModelRequest(model="echo", messages=(Message(role="user", content="a b c"),),
                       stream=True)
    r = send(req, parts.append, model=EchoModel(""))
    assert r.text == "a b c" and "".join(parts) == "a b c" and len(parts) == 3


def test_scripted_from_list_and_exhaustion():
    m = ScriptedModel("", {"responses": [{"text": "one"}]})
    first = send(ModelRequest(model="s", messages=(Message(role="user", content="x"),)), model=m)
    assert first.text == "one"
    from dsh.core.errors import ProviderError

    msgs = (Message(role="user", content="x"), Message(role="assistant", content="one"))
    with pytest.raises(ProviderError, match="no response left"):
        send(ModelRequest(model="s", messages=msgs), model=m)


def test_scripted_bad_file_is_config_error(make_app, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"responses": [{"tool_calls": [{"arguments": {}}]}]}')
    from dsh.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"responses\[0\].tool_calls\[0\] needs a 'name'"):
        make_app().run("x", model=f"scripted:{bad}")
    with pytest.raises(ConfigError, match="no file"):
        make_app().run("x", model=f"scripted:{tmp_path}/missing.json")


def test_context_inside_and_outside_runs(make_app, plugin_module):
    from dsh.core.errors import NoRunContext

    with pytest.raises(NoRunContext, match="outside a run"):
        context()
    seen = {}

    @hookimpl
    def pre_step(step):  # type: ignore[no-untyped-def]
        ctx = context()
        seen["session"] = ctx.session_id
        errors = []

        def escaped() -> None:
            try:
                context()
            except NoRunContext as exc:
                errors.append(exc)

        t = threading.Thread(target=escaped)  # started without copying the context
        t.start()
        t.join()
        seen["thread"] = errors

    result = make_app(load=[plugin_module(pre_step=pre_step)]).run("hi", model="echo")
    assert seen["session"] == result.session_id
    assert len(seen["thread"]) == 1


def test_cleanups_run_in_reverse_order_on_success_and_error(make_app, plugin_module, script):
    order = []

    @hookimpl
    def pre_step(step):  # type: ignore[no-untyped-def]
        ctx = context()
        ctx.add_cleanup(lambda: order.append("first"))
        ctx.add_cleanup(lambda: order.append("second"))

    app = make_app(load=[plugin_module(pre_step=pre_step)])
    app.run("hi", model="echo")
    assert order == ["second", "first"]
    order.clear()
    app.run("hi", model=script({"error": "down"}))
    assert order == ["second", "first"]


def test_concurrent_runs_do_not_see_each_other(make_app, plugin_module):
    seen: dict[str, str] = {}
    barrier = threading.Barrier(2, timeout=5)

    @hookimpl
    def pre_step(step):  # type: ignore[no-untyped-def]
        barrier.wait()
        seen[step.text] = context().session_id

    app = make_app(load=[plugin_module(pre_step=pre_step)])
    results = {}

    def go(text: str) -> None:
        results[text] = app.run(text, model="echo")

    threads = [threading.Thread(target=go, args=(t,)) for t in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"a": results["a"].session_id, "b": results["b"].session_id}
    assert results["a"].session_id != results["b"].session_id


def test_run_performs_no_schema_conversion(make_app, plugin_module, script):
    """D1: the tool table is converted to the provider's format when the session opens; the
    requests of a several-step run convert nothing."""

    def t(x: int) -> int:
        """T."""
        return x

    @hookimpl
    def register_tools(register):  # type: ignore[no-untyped-def]
        register(t)

    app = make_app(load=[plugin_module(register_tools=register_tools)])
    call = {"tool_calls": [{"name": "t", "arguments": {"x": 1}}]}
    model = script(call, call, call, {"text": "done"})
    with app.session(model=model) as s:
        adapter = s.agent.model
        assert adapter.tool_conversions == 1  # done at assembly
        converted = adapter.provider_tools(s.agent.tool_specs)
        result = s.send("go")
        assert result.steps == 4
        assert adapter.tool_conversions == 1  # no conversion during the run
        assert adapter.provider_tools(s.agent.tool_specs) is converted


def test_dsh_context_is_the_function_even_after_every_import():
    import importlib

    import dsh

    for module in ("dsh.app", "dsh.runcontext", "dsh.loop", "dsh.tools"):
        importlib.import_module(module)
    assert callable(dsh.context) and dsh.context.__module__ == "dsh.host.runcontext"


def test_rescue_markers_match_the_parser():
    """The cheap pre-check must let through everything the parser recognises."""
    from dsh.llm import rescue as parser
    from dsh.llm.builtin import RESCUE_MARKERS
    from dsh.llm.builtin import might_be_tool_call

    assert set(parser.MARKERS) <= set(RESCUE_MARKERS)
    assert might_be_tool_call('  {"name": "x"}') and might_be_tool_call("[f()]")
    assert not might_be_tool_call("The answer is 42.")
