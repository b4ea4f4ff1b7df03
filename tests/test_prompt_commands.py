"""The core hooks of issue 24 (dsh/run/commands.py): ``expand_command`` / ``list_commands``
(a leading ``/NAME`` of a prompt) and ``register_agents`` (agents plugins provide), tested
with small plugins loaded through ``load`` — no first-party plugin involved."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh.core.errors import ConfigError
from dsh.core.errors import UsageError
from dsh.run.app import App
from dsh.run.commands import split_command

PLUGIN = '''
from dsh.hookspecs import hookimpl
from dsh.run.commands import CommandExpansion

@hookimpl
def register_agents(register, app):
    for name, settings in app.config.plugin_settings("{mod}").get("agents", {{}}).items():
        register(name, settings, source="{mod}.md")

@hookimpl
def expand_command(name, arguments, agent):
    if name == "up":
        return arguments.upper()
    if name == "pick":
        return CommandExpansion(prompt="picked " + arguments, model="echo")
    if name == "bad":
        return 42
    return None

@hookimpl
def list_commands(agent):
    return {{"up": "shout", "pick": "choose"}}
'''


def app_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: dict[str, object],
             **config: object) -> App:
    for mod in ("cmdplug_a", "cmdplug_b"):
        (tmp_path / f"{mod}.py").write_text(textwrap.dedent(PLUGIN.format(mod=mod)))
    monkeypatch.syspath_prepend(str(tmp_path))
    return App.from_config({"autoload": False, "load": ["cmdplug_a", "cmdplug_b"],
                            "model": "echo", "plugins": settings, **config})


def test_plugin_agents_merge_under_the_config_with_notes(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    app = app_with(tmp_path, monkeypatch, {
        "cmdplug_a": {"agents": {"helper": {"system": "A helps", "description": "helps"},
                                 "mine": {"system": "from a"}}},
        "cmdplug_b": {"agents": {"helper": {"system": "B helps"}}}},
        agents={"mine": {"system": "the config's"}, "lead": {"subagents": ["helper"]}})
    assert app.agent("helper").system == "A helps" or app.agent("helper").system == "B helps"
    assert app.agent("mine").system == "the config's"
    assert any("agent 'mine' from cmdplug_a.md ignored" in n for n in app.notes)
    assert any("agent 'helper' from cmdplug_" in n and "already defined by" in n
               for n in app.notes)
    assert "ask_helper" in app.agent("lead").tools  # usable as a sub-agent


@pytest.mark.parametrize(("agents", "problem"), [
    ({"bad name": {}}, "agent name 'bad name' is not a valid name"),
    ({"x": {"max_steps": "many"}}, "cmdplug_a.md: key 'agents.x.max_steps': expected an integer"),
    ({"x": {"nope": 1}}, "cmdplug_a.md: unknown key 'agents.x.nope'"),
])
def test_a_bad_plugin_agent_is_a_config_error_naming_its_source(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agents: dict[str, object],
        problem: str) -> None:
    app = app_with(tmp_path, monkeypatch, {"cmdplug_a": {"agents": agents}})
    with pytest.raises(ConfigError, match=problem.replace("'", ".").replace("(", ".")):
        _ = app.pm


def test_inherit_runs_a_sub_agent_on_its_parents_model(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    app = app_with(tmp_path, monkeypatch, {
        "cmdplug_a": {"agents": {"kid": {"model": "inherit", "description": "d"}}}},
        agents={"lead": {"model": "echo", "subagents": ["kid"]}})
    assert app.agent("kid").model_id == "echo"  # on its own: the default model
    tool = app.agent("lead").tools["ask_kid"]
    assert tool.subagent == "kid"


def test_expand_and_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dsh.core.errors import PluginError
    from dsh.run.commands import expand
    from dsh.run.commands import known_commands

    app = app_with(tmp_path, monkeypatch, {})
    agent = app.agent()
    assert expand(agent.pm, agent.handle, "up", "hey").prompt == "HEY"
    picked = expand(agent.pm, agent.handle, "pick", "x")
    assert (picked.prompt, picked.model) == ("picked x", "echo")
    with pytest.raises(UsageError, match=r"unknown command '/upp'; did you mean '/up'"):
        expand(agent.pm, agent.handle, "upp", "")
    with pytest.raises(PluginError, match="expand_command returned int for /bad"):
        expand(agent.pm, agent.handle, "bad", "")
    assert known_commands(agent.pm, agent.handle) == {"up": "shout", "pick": "choose"}


def test_split_command_examples() -> None:
    assert split_command("/review src/a.py now") == ("review", "src/a.py now")
    assert split_command("/ns:name\targ") == ("ns:name", "arg")
    assert split_command("/x\nmore lines") == ("x", "more lines")
    assert split_command("/etc/hosts what") is None  # a path is text
    assert split_command("//review") is None  # escaped
    assert split_command(" /review") is None
    assert split_command("/") is None


@given(st.text(max_size=60))
def test_split_command_property(text: str) -> None:
    found = split_command(text)
    if found is None:
        return
    name, arguments = found
    assert text.startswith("/" + name) and not text.startswith("//")
    assert "/" not in name and name.strip() == name and name
    assert arguments == arguments.strip()
    assert arguments in text
