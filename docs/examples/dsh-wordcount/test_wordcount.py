"""Tests of dsh-wordcount: the installed plugin, a scripted model, the session ledger."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dsh.app import App
from dsh.errors import ConfigError
from dsh.events import ToolReturned
from dsh.events import UserMessage


def make_app(tmp_path: Path, *responses: dict[str, Any], **settings: Any) -> App:
    """An app whose model ``fake`` answers with ``responses``, in order."""
    return App.from_config({
        "sessions_dir": str(tmp_path / "sessions"),
        "agents": {"writer": {"plugins": ["wordcount"]}, "chat": {"plugins": []}},
        "plugins": {"wordcount": settings},
        "models": {"fake": {"adapter": "scripted", "responses": list(responses)}},
    })


def test_plugin_is_installed_for_writer_only(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    [plugin] = [p for p in app.plugins if p.name == "wordcount"]
    assert (plugin.dist, plugin.error) == ("dsh-wordcount", None)
    assert "count_words" in app.agent("writer").tools
    assert "count_words" not in app.agent("chat").tools
    assert "call count_words" in app.agent("writer").system


def test_count_words(tmp_path: Path) -> None:
    call = {"name": "count_words", "arguments": {"text": "The cat and the hat"}}
    app = make_app(tmp_path, {"tool_calls": [call]}, {"text": "5 words."}, top=2)
    run = app.run("How many words?", agent="writer", model="fake")
    assert (run.outcome, run.output) == ("completed", "5 words.")
    [result] = [e for e in app.store.read(run.session_id) if isinstance(e, ToolReturned)]
    assert result.status == "ok"
    assert json.loads(result.output) == {
        "words": 5, "distinct": 4, "most_common": [["the", 2], ["cat", 1]]}


def test_tool_error_reaches_the_model(tmp_path: Path) -> None:
    call = {"name": "count_words", "arguments": {"text": "..."}}
    app = make_app(tmp_path, {"tool_calls": [call]}, {"text": "No words."})
    run = app.run("Count this", agent="writer", model="fake")
    [result] = [e for e in app.store.read(run.session_id) if isinstance(e, ToolReturned)]
    assert (result.status, result.output) == ("error", "the text contains no words")


def test_api_keys_never_reach_the_ledger(tmp_path: Path) -> None:
    app = make_app(tmp_path, {"text": "ok"})
    run = app.run("Count sk-abcdefghij0123456789xyz please", agent="writer", model="fake")
    [message] = [e for e in app.store.read(run.session_id) if isinstance(e, UserMessage)]
    assert message.text == "Count [redacted API key] please"
    assert run.path is not None and "sk-abc" not in run.path.read_text()


def test_bad_setting_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="top: expected a positive integer, got 0"):
        make_app(tmp_path, top=0).agent("writer")
