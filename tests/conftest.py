"""Shared fixtures: a fresh app per test, sessions under tmp_path, scripted model files."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dsh.config.loader import config_from_dict
from dsh.run.app import App


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads the developer's config or writes to their data directory."""
    monkeypatch.setenv("DSH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    # Claude Code's and Codex's user folders (dsh-claude reads CLAUDE.md, AGENTS.md and
    # skills there): the machine's own must not shape a test's prompt.
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "claude-config"))
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "codex-home"))
    monkeypatch.delenv("DSH_CONFIG", raising=False)
    monkeypatch.delenv("DSH_LOAD_PLUGINS", raising=False)
    monkeypatch.delenv("DSH_TRACE_HOOKS", raising=False)
    # The default model follows provider keys in the environment (App.default_model).
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)


@pytest.fixture
def script(tmp_path: Path) -> Callable[..., str]:
    """Write a scripted-model file; return the model id ``scripted:PATH``."""
    counter = iter(range(1000))

    def make(*responses: dict[str, Any]) -> str:
        path = tmp_path / f"script{next(counter)}.json"
        path.write_text(json.dumps({"responses": list(responses)}))
        return f"scripted:{path}"

    return make


@pytest.fixture
def plugin_module(monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    """Install an in-memory module as a plugin loadable by ``load = [name]``."""
    counter = iter(range(1000))

    def make(**attrs_: Any) -> str:
        name = f"dsh_test_plugin_{next(counter)}"
        mod = types.ModuleType(name)
        for key, value in attrs_.items():
            setattr(mod, key, value)
        monkeypatch.setitem(sys.modules, name, mod)
        return name

    return make


@pytest.fixture
def make_app(tmp_path: Path) -> Callable[..., App]:
    """``make_app(load=[...], **config)``: an app with autoload off and sessions in tmp."""

    def make(**config: Any) -> App:
        config.setdefault("autoload", False)
        config.setdefault("sessions_dir", str(tmp_path / "sessions"))
        return App(config_from_dict(config))

    return make


def ledger_types(path: Path) -> list[str]:
    return [json.loads(line)["type"] for line in path.read_text().splitlines()]
