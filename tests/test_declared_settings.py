"""Declared plugin settings: ``declare_settings`` + ``dsh.settings`` (docs/api.md), validated
as strictly as dsh's own config, at app build, by ``dsh config validate`` and per agent."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import attrs
import pytest

import dsh


@attrs.frozen
class Limits:
    depth: int = 1


@attrs.frozen
class NotesSettings:
    max_notes: int = 50
    heading: str = "Notes"
    tags: list[str] = attrs.field(factory=list)
    nested: Limits = Limits()


class Notes:
    """A plugin declaring its settings; its tool reports them through dsh.settings()."""

    seen: list[Any]

    def __init__(self) -> None:
        self.seen = []

    @dsh.hookimpl
    def declare_settings(self) -> type:
        return NotesSettings

    @dsh.hookimpl
    def register_tools(self, register: Any, agent: dsh.AgentHandle) -> None:
        self.seen.append(dsh.settings(NotesSettings, agent))

        def show_settings() -> str:
            """The settings of this agent."""
            got = dsh.settings(NotesSettings)  # the current run's agent
            return f"{got.max_notes} {got.heading}"

        register(show_settings)


def _app(dsh_make_app: Any, plugin: Any, **config: Any) -> Any:
    return dsh_make_app({"autoload": False, **config}, plugins={"notes": plugin})


def test_defaults_and_values(dsh_make_app: Any) -> None:
    plugin = Notes()
    app = _app(dsh_make_app, plugin, plugins={"notes": {"max_notes": 3, "tags": ["a"]}})
    app.app.agent()
    assert plugin.seen == [NotesSettings(max_notes=3, tags=["a"])]


def test_agent_overlay_and_tool(dsh_make_app: Any) -> None:
    plugin = Notes()
    config = {"plugins": {"notes": {"max_notes": 3, "heading": "Base"}},
              "agents": {"default": {}, "b": {"plugin_settings": {"notes": {"max_notes": 9}}}}}
    app = _app(dsh_make_app, plugin, **config)
    app.script.tool_call("show_settings", {}).text("done")
    result = app.run("go", agent="b")
    out = [e for e in result.events if type(e).__name__ == "ToolReturned"]
    assert out[0].output == "9 Base"
    assert dsh.settings(NotesSettings, app.app.agent("b").info) is \
        dsh.settings(NotesSettings, app.app.agent("b").info)  # cached on the agent


def test_misspelt_key_names_nearest(dsh_make_app: Any) -> None:
    with pytest.raises(dsh.ConfigError) as err:
        _app(dsh_make_app, Notes(), plugins={"notes": {"max_note": 3}}).app.agent()
    assert "unknown key 'plugins.notes.max_note'; did you mean 'max_notes'?" in str(err.value)


def test_wrong_type_names_key_path(dsh_make_app: Any) -> None:
    with pytest.raises(dsh.ConfigError) as err:
        _app(dsh_make_app, Notes(), plugins={"notes": {"max_notes": "many"}}).app.agent()
    assert "key 'plugins.notes.max_notes': expected an integer" in str(err.value)


def test_nested_and_list_items(dsh_make_app: Any) -> None:
    with pytest.raises(dsh.ConfigError) as err:
        _app(dsh_make_app, Notes(), plugins={"notes": {"nested": {"dept": 2}}}).app.agent()
    assert "unknown key 'plugins.notes.nested.dept'; did you mean 'depth'?" in str(err.value)
    with pytest.raises(dsh.ConfigError) as err:
        _app(dsh_make_app, Notes(), plugins={"notes": {"tags": ["a", 2]}}).app.agent()
    assert "key 'plugins.notes.tags'" in str(err.value) and "item 2" in str(err.value)


def test_overlay_error_names_the_agent(dsh_make_app: Any) -> None:
    config = {"agents": {"default": {},
                         "b": {"plugin_settings": {"notes": {"heading": 5}}}}}
    with pytest.raises(dsh.ConfigError) as err:
        _app(dsh_make_app, Notes(), **config).app.pm  # noqa: B018 - builds and validates
    assert "key 'agents.b.plugin_settings.notes.heading': expected a string" in str(err.value)


def test_not_an_attrs_class_is_a_plugin_error(dsh_make_app: Any) -> None:
    class Bad:
        @dsh.hookimpl
        def declare_settings(self) -> Any:
            return dict

    with pytest.raises(dsh.PluginError, match="declare_settings must return an attrs class"):
        _app(dsh_make_app, Bad()).app.pm  # noqa: B018


def test_undeclared_class_names_the_fix() -> None:
    @attrs.frozen
    class Nobody:
        x: int = 1

    with pytest.raises(dsh.PluginError, match="pass plugin='NAME'"):
        dsh.settings(Nobody, object())


def test_config_validate_reports_it(tmp_path: Any) -> None:
    """``dsh config validate`` in a real process: exit 2, the file and the key on stderr."""
    (tmp_path / "notes_plugin.py").write_text(
        "import attrs, dsh\n"
        "@attrs.frozen\nclass S:\n    max_notes: int = 50\n"
        "@dsh.hookimpl\ndef declare_settings():\n    return S\n")
    cfg = tmp_path / "config.toml"
    cfg.write_text('model = "echo"\nautoload = false\nload = ["notes_plugin"]\n'
                   '[plugins.notes_plugin]\nmax_notse = 1\n')
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(tmp_path),
           "DSH_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-m", "dsh", "--config", str(cfg), "config",
                           "validate"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert f"{cfg}: unknown key 'plugins.notes_plugin.max_notse'; did you mean " \
           "'max_notes'?" in proc.stderr
    cfg.write_text('model = "echo"\nautoload = false\nload = ["notes_plugin"]\n'
                   '[plugins.notes_plugin]\nmax_notes = 1\n')
    ok = subprocess.run([sys.executable, "-m", "dsh", "--config", str(cfg), "config",
                         "validate"], capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok: ")


@attrs.frozen
class Needs:
    token_file: str


class NeedsPlugin:
    @dsh.hookimpl
    def declare_settings(self) -> type:
        return Needs


def test_a_field_without_default_is_a_required_key(dsh_make_app: Any) -> None:
    with pytest.raises(dsh.ConfigError) as err:
        dsh_make_app({"autoload": False}, plugins={"needs": NeedsPlugin()}).app.pm  # noqa: B018
    assert "key 'plugins.needs.token_file': required field missing" in str(err.value)
    app = dsh_make_app({"autoload": False, "plugins": {"needs": {"token_file": "t"}}},
                       plugins={"needs": NeedsPlugin()})
    assert dsh.settings(Needs, app.app.agent().info) == Needs("t")


def test_no_table_costs_no_cattrs(tmp_path: Any) -> None:
    """dsh-web declares its settings: with no config file, ``dsh run`` gets their defaults
    without importing cattrs (a run that has nothing to validate does not pay for it)."""
    pytest.importorskip("dsh_web")
    code = ("import sys, runpy\n"
            "sys.argv = ['dsh', 'run', '-m', 'echo', 'hi']\n"
            "try:\n    runpy.run_module('dsh', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print('cattrs' in sys.modules, 'dsh.config.declared' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                               "DSH_HOME": str(tmp_path / "home"), "DSH_LOAD_PLUGINS": "web",
                               "XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["hi", "False", "True"]
