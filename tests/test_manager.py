"""Plugin managers: built-ins are plugins, blockable and replaceable; hook tracing."""

from __future__ import annotations

import pytest

from dsh.core.errors import ConfigError
from dsh.core.errors import PluginError
from dsh.core.messages import ModelResponse
from dsh.hookspecs import hookimpl
from dsh.host.manager import BUILTIN_PLUGINS
from dsh.host.manager import make_plugin_manager


def test_builtins_are_registered_under_their_names():
    pm = make_plugin_manager()
    assert [name for name, _ in pm.list_name_plugin()] == list(BUILTIN_PLUGINS)


def test_two_managers_share_nothing():
    a, b = make_plugin_manager(), make_plugin_manager()
    assert a is not b and a.hook is not b.hook
    assert a.get_plugin("dsh.tools:HookDispatch") is not b.get_plugin("dsh.tools:HookDispatch")


def test_essential_plugin_cannot_be_disabled():
    with pytest.raises(ConfigError, match="dsh.budget is essential"):
        make_plugin_manager(disable=["dsh.budget"])


@pytest.mark.parametrize("builtin", [n for n in BUILTIN_PLUGINS if n != "dsh.budget"])
def test_each_builtin_can_be_blocked(builtin):
    pm = make_plugin_manager(disable=[builtin])
    assert pm.is_blocked(builtin)
    assert pm.get_plugin(builtin) is None


def test_blocked_builtin_replaced_by_a_plugin(make_app, plugin_module):
    from dsh.llm.base import Model

    @hookimpl
    def register_models(register):  # type: ignore[no-untyped-def]
        register("mine", Model)

    @hookimpl
    def request(call):  # type: ignore[no-untyped-def]
        return ModelResponse(text=f"replacement saw {len(call.request.messages)} message(s)")

    app = make_app(load=[plugin_module(request=request, register_models=register_models)],
                   disable=["dsh.llm.builtin"])
    result = app.run("hi", model="mine")
    assert result.output == "replacement saw 1 message(s)"
    assert "echo" not in app.models  # the built-in registrations are gone with it


def test_blocked_request_core_is_a_clear_error(make_app):
    app = make_app(disable=["dsh.llm.builtin"])
    with pytest.raises(ConfigError, match="no plugin implements the hook 'request'.*"
                                          "'dsh.llm.builtin' is disabled"):
        app.run("hi", model="echo")


def test_replacing_the_loop(make_app, plugin_module):
    @hookimpl
    def run_turn(turn):  # type: ignore[no-untyped-def]
        _, message = turn.inbox.take()
        turn.output = message.text[::-1]
        return "completed"

    app = make_app(load=[plugin_module(run_turn=run_turn)], disable=["dsh.loop"])
    result = app.run("abc", model="echo")
    assert (result.outcome, result.output) == ("completed", "cba")


def test_unknown_hook_in_plugin_is_warned_and_others_still_load(make_app, plugin_module):
    from dsh.core.errors import PluginWarning

    @hookimpl
    def pre_stpe(step):  # type: ignore[no-untyped-def]
        pass

    bad = plugin_module(pre_stpe=pre_stpe)
    app = make_app(load=[bad])
    with pytest.warns(PluginWarning, match="'pre_stpe' is not a dsh hook.*did you mean 'pre_step'"):
        assert app.run("hi", model="echo").output == "hi"  # the others still work
    rec = next(r for r in app.plugins if r.name == bad)
    assert rec.error is None
    with pytest.raises(PluginError, match=f"plugin {bad} failed to register: implements "):
        make_app(load=[bad], strict_plugins=True).agent()


def test_hook_tracing_writes_to_stderr(make_app, monkeypatch, capsys):
    monkeypatch.setenv("DSH_TRACE_HOOKS", "1")
    make_app().run("hi", model="echo")
    assert "run_turn" in capsys.readouterr().err


def test_an_error_passing_through_a_wrapper_is_not_blamed_on_it(make_app, plugin_module,
                                                                 tmp_path):
    """A provider error that only passes through a plugin's request wrapper (its ``yield``)
    names no plugin; an error the wrapper raises itself names it."""
    import json

    @hookimpl(wrapper=True)
    def request(call):  # type: ignore[no-untyped-def]
        response = yield
        return response

    script = tmp_path / "s.json"
    script.write_text(json.dumps({"responses": [{"error": "boom", "status": 400}]}))
    app = make_app(load=[plugin_module(request=request)])
    result = app.run("hi", model=f"scripted:{script}")
    assert result.outcome == "error"
    assert result.reason == "scripted: boom"  # not "(plugin dsh_test_plugin_0, hook request)"

    @hookimpl(wrapper=True)
    def bad_request(call):  # type: ignore[no-untyped-def]
        try:
            response = yield
        except Exception:  # noqa: BLE001
            raise RuntimeError("my wrapper broke") from None
        return response

    name = plugin_module(request=bad_request)
    result = make_app(load=[name]).run("hi", model=f"scripted:{script}")
    assert result.reason == (f"plugin {name} raised in hook request: "
                             "RuntimeError: my wrapper broke")


def test_a_failing_configure_fails_every_use_of_the_app(make_app, plugin_module):
    """A plugin's configure that raises leaves no half-configured plugin manager behind."""
    calls = []

    @hookimpl
    def configure(app):  # type: ignore[no-untyped-def]
        calls.append(app)
        raise ConfigError("plugin setting 'x' is missing")

    app = make_app(load=[plugin_module(configure=configure)])
    for _ in range(2):
        with pytest.raises(ConfigError, match="'x' is missing"):
            app.run("hi", model="echo")
    assert len(calls) == 2
