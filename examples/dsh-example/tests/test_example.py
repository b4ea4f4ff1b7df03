"""Tests of dsh-example, found through its entry point, with dsh.testing's fixtures."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from dsh import hookimpl
from dsh.core.errors import ConfigError
from dsh.ledger.events import PluginEvent
from dsh.ledger.events import StepRejected
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import UserMessage
from dsh.testing import Result
from dsh.testing import Script
from dsh.testing import ScriptedApp

KEY = "ghp_" + "a1B2c3D4" * 4 + "e5F6"  # a GitHub token's shape


def counts(result: Result) -> list[int]:
    """The request counts the plugin recorded in the session, in order."""
    return [e.data["count"] for e in result.events_of(PluginEvent) if e.name == "requests"]


def answers(script: Script, *texts: str) -> None:
    for text in texts:
        script.text(text)


def test_installed_for_writer_only(dsh_app: ScriptedApp) -> None:
    [plugin] = [p for p in dsh_app.app.plugins if p.name == "example"]
    assert (plugin.dist, plugin.error) == ("dsh-example", None)
    assert "request_count" in dsh_app.app.agent("writer").tools
    assert "request_count" not in dsh_app.app.agent("chat").tools


def test_shorthands_are_expanded_before_anything_is_logged(
        dsh_script: Script, dsh_run: Callable[..., Any], review: str) -> None:
    answers(dsh_script, "Cats sleep.", "Cats sleep a lot.")
    result = dsh_run("tldr: cats")
    assert (result.outcome, result.output) == ("completed", "Cats sleep a lot.")
    assert result.requests[0].messages[-1].content == "summarise in one sentence: cats"
    [message, follow_up] = result.events_of(UserMessage)
    assert (message.text, message.source) == ("summarise in one sentence: cats", "user")
    assert (follow_up.text, follow_up.source) == (review, "plugin:example")


def test_a_blocked_word_rejects_the_message(dsh_run: Callable[..., Any]) -> None:
    result = dsh_run("my password is hunter2")
    assert result.outcome == "rejected"
    assert result.requests == []  # the model never saw it
    [rejected] = result.events_of(StepRejected)
    assert (rejected.plugin, rejected.reason) == (
        "example", "the message contains the blocked word 'password'")


def test_chat_does_not_enable_the_plugin(dsh_script: Script,
                                         dsh_run: Callable[..., Any]) -> None:
    dsh_script.text("ok")
    result = dsh_run("tldr: my password", agent="chat")
    assert (result.outcome, result.output) == ("completed", "ok")
    assert len(result.requests) == 1  # no review
    assert result.requests[0].messages[-1].content == "tldr: my password"
    assert counts(result) == []


class Leaky:
    """A plugin of the test: a tool whose result holds a key."""

    @hookimpl
    def register_tools(self, register: Callable[..., None]) -> None:
        def show_config() -> str:
            """Show the configuration."""
            return f"token = {KEY}\nuser = ann"

        register(show_config)


@pytest.mark.parametrize(("agent", "shown"), [
    ("writer", "token = [redacted key]\nuser = ann"),
    ("chat", f"token = {KEY}\nuser = ann"),  # without the plugin: as the tool returned it
])
def test_api_keys_are_redacted_from_tool_results(
        dsh_make_app: Callable[..., ScriptedApp], dsh_config: dict[str, Any],
        agent: str, shown: str) -> None:
    config = copy.deepcopy(dsh_config)
    config["agents"]["writer"]["plugins"].append("leaky")
    config["agents"]["chat"]["plugins"].append("leaky")
    app = dsh_make_app(config, plugins={"leaky": Leaky()})
    app.script.tool_call("show_config")
    answers(app.script, "Done.", "Done.")
    result = app.run("show the config", agent=agent)
    assert result.outcome == "completed", result.reason
    [returned] = result.events_of(ToolReturned)
    assert returned.output == shown
    assert result.requests[1].messages[-1].content == shown  # what the model read


def test_the_review_is_asked_once_per_turn(dsh_script: Script, dsh_run: Callable[..., Any],
                                           review: str) -> None:
    answers(dsh_script, "draft", "final", "draft 2", "final 2")
    first = dsh_run("Write a haiku")
    assert first.output == "final"
    assert [r.messages[-1].content for r in first.requests] == ["Write a haiku", review]
    second = dsh_run("Another one", session=first.session_id)
    assert second.output == "final 2"
    assert [r.messages[-1].content for r in second.requests] == ["Another one", review]


def test_the_request_count_survives_a_restart(dsh_app: ScriptedApp,
                                              dsh_script: Script) -> None:
    answers(dsh_script, "a", "a.")
    first = dsh_app.run("one")
    assert counts(first) == [1, 2]

    restarted = dsh_app.reopen()  # a new App: nothing in memory carries over
    dsh_script.tool_call("request_count")
    answers(dsh_script, "Four so far.", "Five so far.")
    second = restarted.run("how many requests so far?", session=first.session_id)
    [returned] = second.events_of(ToolReturned)
    assert (returned.name, returned.output) == ("request_count", "3")
    assert counts(second) == [1, 2, 3, 4, 5]


def test_two_apps_with_the_same_agents_keep_their_own_settings(
        dsh_make_app: Callable[..., ScriptedApp], dsh_config: dict[str, Any]) -> None:
    other = copy.deepcopy(dsh_config)
    other["plugins"]["example"]["blocked"] = ["secret"]
    first, second = dsh_make_app(dsh_config), dsh_make_app(other)
    answers(first.script, "ok", "ok")
    answers(second.script, "ok", "ok")
    assert first.run("my secret").outcome == "completed"
    assert second.run("my secret").outcome == "rejected"
    assert second.run("my password").outcome == "completed"
    assert first.run("my password").outcome == "rejected"


def test_a_bad_setting_stops_dsh_before_any_request(
        dsh_make_app: Callable[..., ScriptedApp], dsh_config: dict[str, Any]) -> None:
    config = copy.deepcopy(dsh_config)
    config["plugins"]["example"]["blocked"] = "password"
    app = dsh_make_app(config)
    with pytest.raises(ConfigError, match="blocked: expected a list of words"):
        app.app.agent("writer")
    result = app.cli("run", "hello")
    assert result.exit_code == 2
    assert result.stderr == ("dsh: error: [plugins.example] blocked: expected a list of "
                             "words, got 'password'\n")
    assert (result.stdout, result.requests) == ("", [])


def test_the_command_line(dsh_script: Script, dsh_cli: Callable[..., Any]) -> None:
    answers(dsh_script, "draft", "Cats nap.")
    result = dsh_cli("run", "tldr: cats")
    assert (result.exit_code, result.stdout) == (0, "Cats nap.\n")
    assert result.requests[0].messages[-1].content == "summarise in one sentence: cats"
    assert "x/example/requests" in result.event_types
    shown = dsh_cli("sessions", "show", str(result.session_id))
    assert 'x/example/requests {"count":2}' in shown.stdout  # the plugin's events, in place

    rejected = dsh_cli("run", "the password is hunter2")
    assert rejected.exit_code == 4  # rejected (docs/cli.md)
    assert rejected.stdout == ""
    assert "blocked word 'password'" in rejected.stderr
