"""Tests of dsh-notes with dsh.testing's fixtures: only public names (``dsh``, ``dsh.testing``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dsh_notes import NOTES
from dsh_notes import NotesSettings

import dsh
from dsh.testing import Script
from dsh.testing import ScriptedApp


def outputs(result: Any) -> list[str]:
    """What each tool call answered the model, in order."""
    return [d["output"] for d in result.event_dicts if d["type"] == "tool/result"]


def test_only_writer_has_the_tools(dsh_app: ScriptedApp) -> None:
    assert {"add_note", "count_words"} <= set(dsh_app.app.agent("writer").tools)
    assert "add_note" not in dsh_app.app.agent("chat").tools


def test_settings_are_per_agent(dsh_app: ScriptedApp) -> None:
    writer = dsh.settings(NotesSettings, dsh_app.app.agent("writer").info)
    assert writer == NotesSettings(max_notes=2, heading="Remember", protected=["secret*"])


def test_notes_are_recorded_capped_and_shown_next_turn(
        dsh_app: ScriptedApp, dsh_script: Script, dsh_run: Callable[..., Any]) -> None:
    dsh_script.tool_calls(("add_note", {"text": "cats sleep"}), ("add_note", {"text": "a lot"}))
    dsh_script.tool_call("add_note", text="third").text("ok")
    first = dsh_run("remember things", limits={"steps": 5})
    assert sorted(outputs(first)[:2]) == ["noted (1 of 2)", "noted (2 of 2)"]
    assert outputs(first)[2] == "the session already holds 2 notes"  # the reducer's own error
    assert [d["text"] for d in first.plugin_events("dsh_notes", "notes")] in (
        ["cats sleep", "a lot"], ["a lot", "cats sleep"])
    dsh_script.text("done")
    second = dsh_run("what do you know?", session=first.session_id)
    assert "## Remember\n- " in second.requests[0].system
    assert len(dsh_app.state(NOTES, second.session_id)) == 2


def test_count_words_runs_confined(dsh_script: Script, dsh_run: Callable[..., Any]) -> None:
    Path("poem.txt").write_text("one two\nthree\n")
    dsh_script.tool_call("count_words", path="poem.txt").text("done")
    result = dsh_run("count")
    assert outputs(result) == ["poem.txt: 2 lines, 3 words, 14 bytes"]
    [record] = result.plugin_events("dsh_notes", "sandbox")  # what confined it, recorded
    assert record["tool"] == "count_words" and record["policy"]


def test_protected_paths_are_blocked(dsh_script: Script, dsh_run: Callable[..., Any]) -> None:
    Path("secret.txt").write_text("hunter2\n")
    dsh_script.tool_call("count_words", path="secret.txt").text("done")
    result = dsh_run("count the secret")
    [output] = outputs(result)
    assert output == ("tool call blocked by dsh_notes: secret.txt is protected for agent "
                      "writer (secret*)")
    assert "hunter2" not in str(result.event_dicts)


def test_the_command_prints_notes_escaped(dsh_script: Script, dsh_run: Callable[..., Any],
                                          dsh_cli: Callable[..., Any]) -> None:
    dsh_script.tool_call("add_note", text="bold \x1b[1m move").text("ok")
    dsh_run("note it")
    result = dsh_cli("notes")
    assert result.exit_code == 0, result.stderr
    assert "\x1b" not in result.stdout and result.stdout.startswith("- bold ")


def test_a_bad_setting_names_the_key(dsh_make_app: Callable[..., ScriptedApp],
                                     dsh_config: dict[str, Any]) -> None:
    dsh_config["plugins"]["dsh_notes"]["max_note"] = 3
    with pytest.raises(dsh.ConfigError, match="unknown key 'plugins.dsh_notes.max_note'; "
                                              "did you mean 'max_notes'"):
        dsh_make_app(dsh_config).app.agent("writer")
