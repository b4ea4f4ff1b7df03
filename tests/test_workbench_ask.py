"""dsh-shell's ``ask_user``: the model asks the person, on a real pseudo-terminal, and reads
the answer; without a terminal the tool fails at once. Every check reads the session's
ledger (what the model was given) or what the terminal showed."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dsh_shell")

PROMPT = b"(Esc: no answer): "
AGAIN = b"or type your own words: "


def _config(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    config = tmp_path / "dsh.toml"
    config.write_text(textwrap.dedent(f"""
        sessions_dir = {json.dumps(str(tmp_path / "sessions"))}
        autoload = false
        load = ["dsh_shell"]
        [plugins.shell]
        workspace = {json.dumps(str(ws))}
    """))
    return config


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("DSH_LOAD_PLUGINS", "DSH_CONFIG")}


def _ask(question: str, choices: list[str] | None = None) -> dict[str, Any]:
    arguments: dict[str, Any] = {"question": question}
    if choices is not None:
        arguments["choices"] = choices
    return {"tool_calls": [{"name": "ask_user", "arguments": arguments}]}


def _at_terminal(config: Path, answers: list[tuple[bytes, bytes]], *args: str
                 ) -> tuple[bytes, int]:
    """``dsh ARGS`` with a real pseudo-terminal as its controlling terminal; each
    ``(after, typed)`` of ``answers`` types ``typed`` once the terminal shows ``after``
    (the question drops what was typed before it appeared). Returns what the terminal
    showed, raw, and the exit code."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.environ.pop("DSH_LOAD_PLUGINS", None)
            os.environ.pop("DSH_CONFIG", None)
            # A person at a terminal: Ctrl-C interrupts (a test started in the background
            # inherits SIGINT ignored).
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execv(sys.executable, [sys.executable, "-m", "dsh", "--config", str(config),
                                      *args])
        finally:
            os._exit(127)
    out = b""
    seen = 0
    pending = list(answers)
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            if not select.select([fd], [], [], 1)[0]:
                continue
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the child is gone
                break
            if not chunk:
                break
            out += chunk
            if pending and pending[0][0] in out[seen:]:
                seen = len(out)
                os.write(fd, pending.pop(0)[1])
        else:
            os.kill(pid, signal.SIGKILL)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert not pending, out.decode("utf-8", "replace")  # every question was asked
    return out, os.waitstatus_to_exitcode(status)


def _events(tmp_path: Path) -> list[dict[str, Any]]:
    [path] = (tmp_path / "sessions").glob("*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def _result(events: list[dict[str, Any]]) -> dict[str, Any]:
    [result] = [e for e in events if e["type"] == "tool/result" and e["name"] == "ask_user"]
    return result


def _decision(events: list[dict[str, Any]]) -> dict[str, Any]:
    [decision] = [e["data"] for e in events if e["type"] == "x/dsh.tools/approval"]
    return decision


def test_an_answer_typed_on_the_terminal_reaches_the_model(
        tmp_path: Path, script: Callable[..., str]) -> None:
    model = script(_ask("What should the new module be called?"), {"text": "done"})
    shown, code = _at_terminal(_config(tmp_path), [(PROMPT, "Ada Lövelace\r".encode())],
                               "run", "-m", model, "name it")
    assert code == 0, shown
    assert b"dsh: the agent asks: What should the new module be called?" in shown
    events = _events(tmp_path)
    result = _result(events)
    assert (result["status"], result["output"]) == ("ok", "The person answered: Ada Lövelace")
    decision = _decision(events)
    assert (decision["tool"], decision["action"], decision["allowed"], decision["by"]) == (
        "ask_user", "ask", True, "person")
    # The tool result is what the model's next request carries: the turn went on.
    kinds = [(e["type"], e.get("text") or e.get("outcome")) for e in events]
    assert kinds.index(("assistant/message", "done")) > events.index(result)
    assert kinds[-1] == ("turn/end", "completed")


def test_a_numbered_choice_is_the_choice_and_a_wrong_number_is_asked_again(
        tmp_path: Path, script: Callable[..., str]) -> None:
    model = script(_ask("Which database?", ["PostgreSQL", "SQLite", "none"]),
                   {"text": "done"})
    shown, code = _at_terminal(_config(tmp_path), [(PROMPT, b"7\n"), (AGAIN, b"2\n")],
                               "run", "-m", model, "choose")
    assert code == 0, shown
    text = shown.decode("utf-8", "replace")
    for line in ("  1. PostgreSQL", "  2. SQLite", "  3. none"):
        assert line in text, text
    assert "choose 1-3" in text
    assert _result(_events(tmp_path))["output"] == "The person chose 2: SQLite"


def test_free_text_is_an_answer_even_with_choices(
        tmp_path: Path, script: Callable[..., str]) -> None:
    model = script(_ask("Which database?", ["PostgreSQL", "SQLite"]), {"text": "done"})
    _, code = _at_terminal(_config(tmp_path), [(PROMPT, b"DuckDB, please\n")],
                           "run", "-m", model, "choose")
    assert code == 0
    assert _result(_events(tmp_path))["output"] == "The person answered: DuckDB, please"


def test_an_escape_sequence_in_the_question_is_shown_not_obeyed(
        tmp_path: Path, script: Callable[..., str]) -> None:
    question = "Proceed?\x1b]0;owned\x07\x1b[2J\rfake line\u202eevil"
    model = script(_ask(question, ["yes\x1b]52;c;cHduZWQ=\x07", "no"]), {"text": "done"})
    shown, code = _at_terminal(_config(tmp_path), [(PROMPT, b"1\n")],
                               "run", "-m", model, "go")
    assert code == 0, shown
    for raw in (b"\x1b]0;owned", b"\x1b[2J", b"\x1b]52;", "\u202e".encode(), b"\rfake"):
        assert raw not in shown, shown
    assert b"Proceed?\\x1b]0;owned\\x07\\x1b[2J\\rfake line\\u202eevil" in shown, shown
    assert b"1. yes\\x1b]52;c;cHduZWQ=\\x07" in shown, shown
    # The model gets its own choice back as it wrote it.
    assert _result(_events(tmp_path))["output"] == "The person chose 1: yes\x1b]52;c;cHduZWQ=\x07"


def test_without_a_terminal_the_tool_fails_at_once(
        tmp_path: Path, script: Callable[..., str]) -> None:
    model = script(_ask("Which database?", ["PostgreSQL", "SQLite"]),
                   {"text": "assumed SQLite"})
    # stdin carries piped data, and there is no controlling terminal (a new session).
    proc = subprocess.run([sys.executable, "-m", "dsh", "--config", str(_config(tmp_path)),
                           "run", "-m", model, "--json", "summarise"],
                          input="1\nsome piped data\n", capture_output=True, text=True,
                          timeout=120, env=_env(), start_new_session=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["output"] == "assumed SQLite"
    events = _events(tmp_path)
    result = _result(events)
    assert result["status"] == "error"
    assert result["output"].startswith("no one can answer:")
    assert "decide yourself and say what you assumed" in result["output"]
    decision = _decision(events)
    assert (decision["allowed"], decision["by"]) == (False, "no-terminal")


@pytest.mark.parametrize("typed", [b"\x1b", b"\n"])
def test_esc_or_an_empty_line_is_no_answer(tmp_path: Path, script: Callable[..., str],
                                           typed: bytes) -> None:
    model = script(_ask("Which database?"), {"text": "assumed"})
    _, code = _at_terminal(_config(tmp_path), [(PROMPT, typed)], "run", "-m", model, "go")
    assert code == 0
    result = _result(_events(tmp_path))
    assert result["status"] == "error"
    assert "the person gave no answer; decide yourself" in result["output"]


def test_ctrl_c_while_asking_stops_the_run_and_the_ledger_loads(
        tmp_path: Path, script: Callable[..., str]) -> None:
    config = _config(tmp_path)
    model = script(_ask("Which database?"), {"text": "never reached"})
    shown, code = _at_terminal(config, [(PROMPT, b"\x03")], "run", "-m", model, "go")
    assert code == 130, shown
    events = _events(tmp_path)
    assert _result(events)["status"] == "interrupted"  # the abort ended the question
    assert not any("never reached" in json.dumps(e) for e in events)
    show = subprocess.run([sys.executable, "-m", "dsh", "--config", str(config), "sessions",
                           "show", "latest"], capture_output=True, text=True, timeout=60,
                          env=_env(), start_new_session=True)
    assert show.returncode == 0, show.stderr
    assert "ask_user" in show.stdout


def test_dsh_chat_asks_inline(tmp_path: Path, script: Callable[..., str]) -> None:
    """In ``dsh chat`` the question is asked on the chat's terminal; the chat's reader of
    typed lines steps aside, so the answer is the tool's result, not a message."""
    pexpect = pytest.importorskip("pexpect")
    model = script(_ask("Favourite colour?", ["red", "blue"]), {"text": "made it"})
    config = _config(tmp_path)
    config.write_text(config.read_text().replace(
        "autoload = false", f"autoload = false\nmodel = {json.dumps(model)}"))
    before = signal.getsignal(signal.SIGINT)
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        child = pexpect.spawn(sys.executable, ["-m", "dsh", "--config", str(config), "chat"],
                              env={**_env(), "NO_COLOR": "1", "TERM": "xterm",
                                   "PROMPT_TOOLKIT_NO_CPR": "1"}, encoding="utf-8", timeout=60,
                              dimensions=(40, 200))
    finally:
        if before == signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    child.expect("›")
    child.sendline("pick one")
    child.expect(r"the agent asks: Favourite colour\?")
    child.expect(r"\(Esc: no answer\): ")
    child.sendline("2")
    child.expect("made it")
    child.expect("›")
    child.sendeof()
    child.expect(pexpect.EOF)
    events = _events(tmp_path)
    assert _result(events)["output"] == "The person chose 2: blue"
    assert not any(e["type"] == "user/message" and e.get("text") == "2" for e in events)
