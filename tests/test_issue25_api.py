"""Issue 25, item 5: configs as TOML path or text (App.from_config, dsh_make_app); the
scripted model's tool-call ids are the same in dsh.testing and `dsh run -m scripted:FILE`;
App.default_model considers stored keys; dsh.testing reads recorded state from a result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from dsh.core.errors import ConfigError
from dsh.run.app import App
from dsh.run.app import is_toml_text

REPO = Path(__file__).resolve().parent.parent
TOML = 'autoload = false\nmodel = "echo"\nmax_steps = 7\n'


def test_from_config_takes_a_path_toml_text_or_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "dsh.toml"
    path.write_text(TOML)
    assert App.from_config(path).config.max_steps == 7
    assert App.from_config(str(path)).config.max_steps == 7
    assert App.from_config(TOML).config.max_steps == 7
    assert App.from_config({"max_steps": 7}).config.max_steps == 7
    with pytest.raises(ConfigError, match=r"<config text>: invalid TOML: .*line 1"):
        App.from_config("model = \n")
    with pytest.raises(ConfigError, match="<config text>:1: key .max_steps."):
        App.from_config('max_steps = "many"\n')
    with pytest.raises(ConfigError, match="config file not found"):
        App.from_config(str(tmp_path / "missing.toml"))


def test_a_path_with_an_equals_sign_is_still_a_path(tmp_path: Path) -> None:
    odd = tmp_path / "a=b.toml"
    odd.write_text(TOML)
    assert not is_toml_text(str(odd))
    assert App.from_config(str(odd)).config.max_steps == 7
    assert is_toml_text("x = 1") and is_toml_text("[agents.a]\nmodel='echo'")
    assert not is_toml_text("dsh.toml")


def test_dsh_make_app_takes_a_toml_path_or_text(dsh_make_app: Any, tmp_path: Path) -> None:
    path = tmp_path / "dsh.toml"
    path.write_text('autoload = false\n[agents.calc]\nsystem = "Be exact."\n')
    for config in (path, str(path), path.read_text()):
        app = dsh_make_app(config, script=[{"text": "4"}])
        assert app.run("2+2", agent="calc").output == "4"
        assert app.requests[-1].system == "Be exact."
    with pytest.raises(ConfigError, match="missing.toml: config file not found"):
        dsh_make_app(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="<config text>: invalid TOML"):
        dsh_make_app("autoload = \n")


def test_scripted_tool_call_ids_are_the_same_everywhere(dsh_make_app: Any,
                                                        tmp_path: Path) -> None:
    replies = [{"tool_calls": [{"name": "nosuch", "arguments": {}},
                               {"name": "nosuch", "arguments": {}}]},
               {"tool_calls": [{"name": "nosuch", "arguments": {}}]}, {"text": "done"}]
    app = dsh_make_app({"autoload": False}, script=replies)
    result = app.run("go")
    in_process = [e.call_id for e in result.events if e.type == "tool/result"]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": replies}))
    sessions = tmp_path / "cli-sessions"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DSH_LOAD_PLUGINS", None)
    r = subprocess.run([sys.executable, "-m", "dsh", "--config", "/dev/null", "run", "--json",
                        "-m", f"scripted:{script}", "go"], capture_output=True, text=True,
                       env={**env, "DSH_SESSIONS_DIR": str(sessions)}, timeout=60,
                       stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    path = json.loads(r.stdout)["path"]
    lines = [json.loads(x) for x in Path(path).read_text().splitlines()]
    by_cli = [x["call_id"] for x in lines if x["type"] == "tool/result"]
    assert in_process == by_cli == ["call_0_0", "call_0_1", "call_1_0"]


def test_default_model_considers_stored_keys(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from dsh.config.keys import FileStore

    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("DSH_KEYS_BACKEND", "file")
    cfg = {"autoload": False}
    assert App.from_config(cfg).default_model.fallback  # nothing stored: echo
    FileStore().set("anthropic", "sk-ant-stored-0123456789")
    chosen = App.from_config(cfg).default_model
    assert chosen.id == "anthropic:claude-haiku-4-5" and "'anthropic' is stored" in chosen.why
    assert "sk-ant" not in chosen.why
    FileStore().set("openai", "sk-stored-0123456789")
    assert App.from_config(cfg).default_model.id == "openai:gpt-4o-mini"  # the same order
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")  # the environment still wins
    assert App.from_config(cfg).default_model.id == "anthropic:claude-haiku-4-5"


def test_a_broken_key_store_does_not_stop_the_default_choice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    xdg = tmp_path / "xdg"
    (xdg / "dsh" / "keys").mkdir(parents=True)
    (xdg / "dsh" / "keys").chmod(0o777)  # refused by the file store
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    monkeypatch.setenv("DSH_KEYS_BACKEND", "file")
    assert App.from_config({"autoload": False}).default_model.fallback


def counted(state: int, data: Mapping[str, Any]) -> int:
    return state + 1


def test_dsh_testing_reads_state_from_a_result(dsh_make_app: Any) -> None:
    from dsh import StateKey
    from dsh import hookimpl

    key = StateKey("counter", "n", 0, counted)

    class Counter:
        @hookimpl
        def pre_step(self, step: Any) -> None:
            key.update({})

    app = dsh_make_app({"autoload": False}, plugins={"counter": Counter()},
                       script=[{"text": "a"}, {"text": "b"}])
    first = app.run("one")
    assert app.state(key, first) == 1
    again = app.reopen().run("two", session=first.session_id)
    assert app.state(key, again) == 2 and app.state(key) == 2  # latest
