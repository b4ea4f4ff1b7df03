"""Tests of dsh-wordcount, found through its entry point, with dsh.testing's fixtures."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from dsh.core.errors import ConfigError
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import UserMessage
from dsh.testing import PromptResult
from dsh.testing import Script
from dsh.testing import ScriptedApp


@pytest.fixture
def dsh_config() -> dict[str, Any]:
    """The app of every test (``dsh_app``): `writer` enables the plugin, `chat` does not."""
    return {"agents": {"writer": {"plugins": ["wordcount"]}, "chat": {"plugins": []}},
            "plugins": {"wordcount": {"top": 2}}}


def test_plugin_is_installed_for_writer_only(dsh_app: ScriptedApp) -> None:
    app = dsh_app.app
    [plugin] = [p for p in app.plugins if p.name == "wordcount"]
    assert (plugin.dist, plugin.error) == ("dsh-wordcount", None)
    assert "count_words" in app.agent("writer").tools
    assert "count_words" not in app.agent("chat").tools
    assert "call count_words" in app.agent("writer").system


def test_count_words(dsh_script: Script, dsh_run: Callable[..., PromptResult]) -> None:
    dsh_script.tool_call("count_words", text="The cat and the hat").text("5 words.")
    result = dsh_run("How many words?", agent="writer")
    assert (result.outcome, result.output) == ("completed", "5 words.")
    [returned] = result.events_of(ToolReturned)
    assert returned.status == "ok"
    assert json.loads(returned.output) == {
        "words": 5, "distinct": 4, "most_common": [["the", 2], ["cat", 1]]}
    assert result.requests[1].messages[-1].content == returned.output  # what the model read


def test_tool_error_reaches_the_model(dsh_script: Script,
                                      dsh_run: Callable[..., PromptResult]) -> None:
    dsh_script.tool_call("count_words", text="...").text("No words.")
    result = dsh_run("Count this", agent="writer")
    [returned] = result.events_of(ToolReturned)
    assert (returned.status, returned.output) == ("error", "the text contains no words")


def test_api_keys_reach_neither_the_ledger_nor_the_model(
        dsh_script: Script, dsh_run: Callable[..., PromptResult]) -> None:
    dsh_script.text("ok")
    result = dsh_run("Count sk-abcdefghij0123456789xyz please", agent="writer")
    [message] = result.events_of(UserMessage)
    assert message.text == "Count [redacted API key] please"
    assert "sk-abc" not in json.dumps(result.event_dicts) + json.dumps(result.request_dicts)


def test_bad_setting_is_a_config_error(dsh_make_app: Callable[..., ScriptedApp],
                                       dsh_config: dict[str, Any]) -> None:
    dsh_config["plugins"]["wordcount"]["top"] = 0
    with pytest.raises(ConfigError, match="top: expected a positive integer, got 0"):
        dsh_make_app(dsh_config).app.agent("writer")
