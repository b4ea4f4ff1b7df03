"""Per-agent scope (A6) with a plugin loaded through a real entry point."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from dsh.config.loader import config_from_dict
from dsh.core.errors import UsageError
from dsh.hookspecs import hookimpl
from dsh.run.app import App

FAKE = '''
from dsh import hookimpl

seen = []

def alpha(x: str) -> str:
    """Alpha tool."""
    return "alpha:" + x

@hookimpl
def register_tools(register, agent):
    register(alpha)

@hookimpl
def register_prompt(register):
    register("You may use alpha.", name="alpha-hint")

@hookimpl
def pre_step(step):
    seen.append(step.agent)
    step.text = step.text + " [seen by fake]"
'''


@pytest.fixture
def installed_fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real distribution on sys.path: module + dist-info with a ``dsh`` entry point."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "dsh_fake.py").write_text(textwrap.dedent(FAKE))
    info = site / "dsh_fake-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dsh-fake\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text("[dsh]\nfake = dsh_fake\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(__import__("sys").modules, "dsh_fake", raising=False)
    return site


def beta(y: int) -> int:
    """Beta tool."""
    return y * 2


@hookimpl
def register_tools(register):  # type: ignore[no-untyped-def]
    register(beta)


@hookimpl
def register_prompt(register):  # type: ignore[no-untyped-def]
    register("Beta is for numbers.", order=10)


def test_two_agents_two_plugins_never_leak(installed_fake, tmp_path, plugin_module, script):
    local = plugin_module(register_tools=register_tools, register_prompt=register_prompt)
    app = App(config_from_dict({
        "sessions_dir": str(tmp_path / "s"),
        "load": [local],
        "agents": {"x": {"plugins": ["fake"], "system": "You are X."},
                   "y": {"plugins": [local]}},
    }))
    fake = next(r for r in app.plugins if r.name == "fake")
    assert (fake.dist, fake.version, fake.error) == ("dsh-fake", "0.3", None)

    x, y = app.agent("x"), app.agent("y")
    assert list(x.tools) == ["alpha"] and list(y.tools) == ["beta"]
    assert x.system == "You are X.\n\nYou may use alpha."
    assert y.system == "Beta is for numbers."
    assert [(p.plugin, p.name) for p in x.prompt_parts] == [("config", "system"),
                                                          ("fake", "alpha-hint")]

    import dsh_fake

    rx = app.run("hello", agent="x", model="echo")
    ry = app.run("hello", agent="y", model="echo")
    assert rx.output == "hello [seen by fake]"
    assert ry.output == "hello"  # fake's pre_step never ran for y
    assert dsh_fake.seen == ["x"]

    # y's model calls alpha: the tool is not in its scope, so it is an unknown-tool error
    call = {"tool_calls": [{"name": "alpha", "arguments": {"x": "1"}}]}
    r = app.run("try", agent="y", model=script(call, {"text": "ok"}))
    assert r.outcome == "completed"
    result = [e for e in app.store.read(r.session_id) if e.type == "tool/result"][0]
    assert result.status == "error" and result.output == "unknown tool 'alpha'"  # type: ignore[attr-defined]


def test_agent_without_plugin_list_gets_every_installed_plugin(installed_fake, tmp_path):
    app = App(config_from_dict({"sessions_dir": str(tmp_path / "s")}))
    assert "alpha" in app.agent().tools


def test_allowlist_env_excludes_plugins(installed_fake, tmp_path, monkeypatch):
    monkeypatch.setenv("DSH_LOAD_PLUGINS", "")
    app = App(config_from_dict({"sessions_dir": str(tmp_path / "s")}))
    assert [r.name for r in app.plugins] == []
    monkeypatch.setenv("DSH_LOAD_PLUGINS", "fake")
    app = App(config_from_dict({"sessions_dir": str(tmp_path / "s")}))
    assert [r.name for r in app.plugins] == ["fake"]


def test_unknown_plugin_in_agent_list_is_usage_error(make_app):
    app = make_app(agents={"a": {"plugins": ["nope"]}})
    with pytest.raises(UsageError, match="agent 'a'.*unknown plugin\\(s\\) nope"):
        app.agent("a")


def test_plugin_that_fails_to_import_is_reported_not_fatal(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "dsh_broken-1.0.dist-info").mkdir(parents=True)
    (site / "dsh_broken.py").write_text("raise ImportError('needs libfoo')\n")
    (site / "dsh_broken-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: dsh-broken\nVersion: 1.0\n")
    (site / "dsh_broken-1.0.dist-info" / "entry_points.txt").write_text(
        "[dsh]\nbroken = dsh_broken\n")
    monkeypatch.syspath_prepend(str(site))
    app = App(config_from_dict({"sessions_dir": str(tmp_path / "s")}))
    broken = next(r for r in app.plugins if r.name == "broken")
    assert broken.error == "ImportError: needs libfoo"
    assert broken.label == "broken (dsh-broken 1.0)"
    assert app.run("still works", model="echo").output == "still works"

    from dsh.core.errors import PluginError

    strict = App(config_from_dict({"sessions_dir": str(tmp_path / "s"), "strict_plugins": True}))
    with pytest.raises(PluginError, match=r"plugin broken \(dsh-broken 1.0\) failed to load"):
        strict.plugins  # noqa: B018
