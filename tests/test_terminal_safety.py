"""Untrusted text (a model's, a tool's, a ledger's) never drives the terminal.

Every writer of dsh that targets a terminal — the trajectory view, streamed run output, the
final answer, ``--json``/``--events`` lines, the status line, the approval question, error
lines on stderr — passes untrusted text through :func:`dsh.cli.escape.escape_controls`, and a
pipe gets the bytes unchanged. Checked on real pseudo-terminals (``os.openpty``), in process
with generated hostile text and end to end with ``dsh`` as a child process. The approval
question is checked under a pty that is the child's controlling terminal (``pty.fork``).
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import tty
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.cli.escape import escape_controls
from dsh.cli.escape import escape_json_controls
from dsh.cli.render import trajectory
from dsh.run.app import App

#: Sequences a hostile model or tool would send: clipboard (OSC 52), title, clear screen,
#: DCS, 8-bit CSI/OSC/ST, BEL, backspace and carriage-return overwrites, bidi overrides.
DANGER = ["\x1b]52;c;cm0gLXJmIH4=\x07", "\x1b]0;pwned\x07", "\x1b[2J\x1b[H", "\x1b[31m",
          "\x1bP+q544e\x1b\\", "\x9b2J", "\x9d0;title\x9c", "\x07", "safe\b\b\b\bevil",
          "ok\rrm -rf ~", "\u202eexe.txt", "\u2066x\u2069", "\x7f", "\x00", "\x1b", "\x85",
          "\x0b\x0c", "\r\n"]
hostile = st.lists(st.one_of(st.sampled_from(DANGER),
                             st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)),
                   min_size=1, max_size=8).map("".join)

#: What must never reach a terminal from untrusted text (newline and tab are kept).
FORBIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                       "\u2066-\u2069]")
#: dsh's own sequences on stderr: the status line's erase-to-end-of-line.
ERASE = "\x1b[K"


def forbidden_in(shown: str, *, status: bool = False) -> list[str]:
    """Forbidden characters in what a terminal received. With ``status``, dsh's own status
    line sequences are allowed: ``\\x1b[K``, and ``\\r`` at the start of a line."""
    found = []
    pieces = shown.split(ERASE) if status else [shown]
    for piece in pieces:
        if status:
            piece = re.sub(r"(^|\n)\r", r"\1", piece)
        found += FORBIDDEN.findall(piece)
    return found


# --------------------------------------------------------------------------------------------
# The function
# --------------------------------------------------------------------------------------------


@given(hostile)
@settings(max_examples=500)
def test_escaped_text_holds_no_control_but_newline_and_tab(text: str) -> None:
    shown = escape_controls(text)
    assert FORBIDDEN.findall(shown) == []
    one_line = escape_controls(text, newlines=False)
    assert FORBIDDEN.findall(one_line) == [] and "\n" not in one_line and "\t" not in one_line
    if "\x1b" in text:
        assert "\\x1b" in shown  # made visible, not dropped


@given(st.text(st.characters(blacklist_categories=("Cc", "Cs", "Cf"))))
def test_text_without_controls_is_unchanged(text: str) -> None:
    assert escape_controls(text) == text


@given(st.dictionaries(st.text(max_size=5), hostile, max_size=4))
def test_json_for_a_terminal_is_the_same_json_value(data: dict[str, str]) -> None:
    line = json.dumps(data, ensure_ascii=False)
    safe = escape_json_controls(line)
    assert json.loads(safe) == data
    assert FORBIDDEN.findall(safe) == []


# --------------------------------------------------------------------------------------------
# Every writer, in process, on a real pty
# --------------------------------------------------------------------------------------------


class Pty:
    """A pseudo-terminal in raw mode (no newline translation): what is written to
    :attr:`stream` arrives byte for byte in :meth:`take`."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)
        self.stream = open(os.dup(self.slave), "w", encoding="utf-8",  # noqa: SIM115
                           errors="strict", closefd=True)
        self.data = bytearray()
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        self._marks = 0

    def _read(self) -> None:
        while not self._stop:
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:
                    return
                with self._lock:
                    self.data += chunk

    def answer(self, question: bytes, typed: bytes, timeout: float = 30) -> None:
        """Type ``typed`` once the terminal has shown ``question`` (after what it showed
        before this call)."""
        with self._lock:
            start = len(self.data)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if question in self.data[start:]:
                    break
            time.sleep(0.02)
        os.write(self.master, typed)

    def take(self) -> str:
        """Everything written so far (waits for it to arrive)."""
        self._marks += 1
        mark = f"<<end {self._marks}>>".encode()
        os.write(self.slave, mark)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with self._lock:
                if mark in self.data:
                    shown = bytes(self.data[: self.data.index(mark)])
                    del self.data[: self.data.index(mark) + len(mark)]
                    return shown.decode("utf-8", errors="surrogateescape")
            time.sleep(0.005)
        raise AssertionError("the pty did not deliver what was written")

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.stream.close()
        os.close(self.master)
        os.close(self.slave)


@pytest.fixture
def term() -> Iterator[Pty]:
    t = Pty()
    try:
        yield t
    finally:
        t.close()


@pytest.fixture
def scripted_app(tmp_path: Path) -> Callable[[list[dict[str, Any]]], tuple[App, str]]:
    ws = tmp_path / "ws"
    ws.mkdir()
    counter = iter(range(10_000))

    def make(responses: list[dict[str, Any]]) -> tuple[App, str]:
        path = tmp_path / f"script{next(counter)}.json"
        path.write_text(json.dumps({"responses": responses}))
        app = App.from_config({"sessions_dir": str(tmp_path / "sessions"),
                               "plugins": {"shell": {"workspace": str(ws),
                                                     "tty": str(tmp_path / "none")}},
                               "agents": {"a": {}}})
        return app, f"scripted:{path}"

    return make


HYPO = settings(max_examples=25, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@given(text=hostile, name=hostile, arg=hostile)
@HYPO
def test_the_trajectory_view_on_a_terminal_shows_controls_escaped(
        term: Pty, scripted_app: Callable[..., tuple[App, str]], text: str, name: str,
        arg: str) -> None:
    app, model = scripted_app([
        {"text": text, "tool_calls": [{"name": name, "arguments": {"x": arg}},
                                      {"name": "run_command",
                                       "arguments": {"command": f"echo {json.dumps(arg)}"}}]},
        {"text": text}])
    run = app.run(f"say {text}", agent="a", model=model)
    events = app.store.read(run.session_id)
    for color in (False, True):
        term.stream.write(trajectory(events, color=color, full=True, terminal=True))
        term.stream.flush()
        shown = term.take()
        if color:  # dsh's own styling: SGR sequences only
            shown = re.sub(r"\x1b\[[0-9;]*m", "", shown)
        assert forbidden_in(shown) == [], repr(shown)
    # Not on a terminal: the view holds the ledger's text unchanged.
    raw = trajectory(events, full=True)
    for char in ("\x1b", "\x9b", "\x07", "\u202e"):
        if char in text + name:
            assert char in raw, repr(char)


@given(deltas=st.lists(hostile, min_size=1, max_size=5), name=hostile, note=hostile)
@HYPO
def test_streamed_text_status_line_and_notes_on_a_terminal(
        term: Pty, monkeypatch: pytest.MonkeyPatch, deltas: list[str], name: str,
        note: str) -> None:
    from dsh.cli.status import StatusLine
    from dsh.cli.streams import Stdout
    from dsh.cli.terminal import RunOutput

    monkeypatch.setattr(sys, "stdout", term.stream)
    monkeypatch.setattr(sys, "stderr", term.stream)
    monkeypatch.setenv("NO_COLOR", "1")
    output = RunOutput(Stdout(), stream=True)
    assert output.tty and output.printer is not None and output.status is not None
    for delta in deltas:  # a sequence split across deltas is escaped piece by piece
        output.printer.on_text(delta)
    output.printer.finish()
    assert forbidden_in(term.take()) == []

    status = StatusLine(term.stream)
    status.on_event(type("E", (), {"type": "tool/call", "name": name})())
    status.draw()
    status.note(note)
    status.draw()
    status.stop()
    assert forbidden_in(term.take(), status=True) == []

    output.note(note)
    final = RunOutput(Stdout(), stream=False)
    result = type("R", (), {"output": "".join(deltas), "outcome": "completed",
                            "session_id": "s", "reason": note, "steps": 1, "path": None,
                            "usage": type("U", (), {"input_tokens": 0, "output_tokens": 0})})
    final.finish(result, "a", "m")
    for flag in ("events", "as_json"):
        RunOutput(Stdout(), **{flag: True}).finish(result, "a", "m")
    output.status.stop()
    assert forbidden_in(term.take(), status=True) == []


@given(message=hostile)
@HYPO
def test_error_lines_on_a_terminal(term: Pty, monkeypatch: pytest.MonkeyPatch,
                                   message: str) -> None:
    from dsh.cli.shared import Failure
    from dsh.cli.shared import warn

    monkeypatch.setattr(sys, "stderr", term.stream)
    warn(f"warning: {message}")
    Failure(message, 1).show()
    assert forbidden_in(term.take()) == []


@given(command=hostile)
@HYPO
def test_the_approval_question_on_a_terminal(term: Pty, tmp_path: Path, command: str) -> None:
    from dsh_shell.commands import run_command
    from dsh_shell.settings import ShellSettings

    from dsh.core.errors import ToolError

    settings_ = ShellSettings(workspace=str(tmp_path), tty=os.ttyname(term.slave), allow=())
    answer = threading.Thread(target=term.answer, args=(b"say why: ", b"n\n"), daemon=True)
    answer.start()  # typed once the question is shown (what came before it is drained)
    with pytest.raises(ToolError):
        run_command(settings_, "rm " + json.dumps(command))
    answer.join(5)
    shown = term.take()
    assert "dsh: run_command wants to run `rm " in shown
    assert forbidden_in(shown.replace("\n", "", 1)) == []


# --------------------------------------------------------------------------------------------
# End to end: dsh on a pty, and on a pipe
# --------------------------------------------------------------------------------------------

HOSTILE = "".join(DANGER)
TOOL = "\x1b]0;tool\x07"


def _config(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    config = tmp_path / "dsh.toml"
    config.write_text(f'sessions_dir = {json.dumps(str(tmp_path / "sessions"))}\n'
                      f'[plugins.shell]\nworkspace = {json.dumps(str(ws))}\n'
                      'allow = ["echo", "sleep"]\n')
    return config


def _script(tmp_path: Path, *responses: dict[str, Any]) -> str:
    path = tmp_path / f"script-{len(list(tmp_path.glob('script-*')))}.json"
    path.write_text(json.dumps({"responses": list(responses)}))
    return f"scripted:{path}"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DSH_LOAD_PLUGINS", "DSH_CONFIG")}
    env["NO_COLOR"] = "1"
    return env


def _dsh_on_ptys(config: Path, *args: str) -> tuple[int, str, str]:
    """Run dsh with stdout and stderr each on its own raw pty; return (code, out, err)."""
    out, err = Pty(), Pty()
    try:
        proc = subprocess.run([sys.executable, "-m", "dsh", "--config", str(config), *args],
                              stdin=subprocess.DEVNULL, stdout=out.slave, stderr=err.slave,
                              env=_env(), timeout=60, start_new_session=True)
        return proc.returncode, out.take(), err.take()
    finally:
        out.close()
        err.close()


def _dsh_piped(config: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "dsh", "--config", str(config), *args],
                          stdin=subprocess.DEVNULL, capture_output=True, env=_env(),
                          timeout=60, start_new_session=True)


def test_dsh_on_a_terminal_shows_hostile_text_escaped(tmp_path: Path) -> None:
    config = _config(tmp_path)
    model = _script(tmp_path,
                    {"text": HOSTILE, "tool_calls": [
                        {"name": "run_command",
                         "arguments": {"command": f"echo {json.dumps(HOSTILE)}"}},
                        # Both calls are logged before either runs: the status line says
                        # "running tool <TOOL>" while the sleep runs.
                        {"name": "run_command", "arguments": {"command": "sleep 0.5"}},
                        {"name": TOOL, "arguments": {}}]},
                    {"text": HOSTILE, "delay": 0.3})
    code, out, err = _dsh_on_ptys(config, "run", "-m", model, HOSTILE.replace("\0", ""))
    assert code == 0, err
    assert "\\x1b]52;c;" in out  # the text arrived, made visible
    assert forbidden_in(out) == [], repr(out)
    assert "running tool \\x1b]0;tool\\x07" in err  # the status line showed the name
    assert forbidden_in(err, status=True) == [], repr(err)
    for args in (["sessions", "show", "--full", "latest"], ["sessions", "list"],
                 ["sessions", "list", "--json"],
                 ["sessions", "export", "latest"],
                 ["sessions", "export", "--format", "jsonl", "latest"]):
        code, out, err = _dsh_on_ptys(config, *args)
        assert code == 0, err
        assert "\\x1b" in out or "\\u001b" in out, (args, out)
        assert forbidden_in(out) == [], (args, repr(out))
    failing = _script(tmp_path, {"error": HOSTILE})
    code, out, err = _dsh_on_ptys(config, "run", "-m", failing, "hi")
    assert code == 1 and "dsh: error: scripted: " in err
    assert forbidden_in(err, status=True) == [], repr(err)


def test_dsh_on_a_pipe_passes_the_bytes_unchanged(tmp_path: Path) -> None:
    config = _config(tmp_path)
    model = _script(tmp_path, {"text": HOSTILE})
    proc = _dsh_piped(config, "run", "-m", model, "hi")
    assert proc.returncode == 0, proc.stderr
    assert HOSTILE.endswith("\n")  # so dsh adds no newline of its own
    assert proc.stdout == HOSTILE.encode()
    proc = _dsh_piped(config, "run", "-m", _script(tmp_path, {"text": HOSTILE}), "--json", "hi")
    assert json.loads(proc.stdout)["output"] == HOSTILE
    assert "\x9b".encode() in proc.stdout  # JSON leaves C1 raw: a pipe gets it as is
    proc = _dsh_piped(config, "sessions", "show", "latest")
    assert proc.returncode == 0 and b"\x1b]52;c;" in proc.stdout


# --------------------------------------------------------------------------------------------
# The approval question on the controlling terminal
# --------------------------------------------------------------------------------------------


def _spawn_on_a_terminal(config: Path, *args: str) -> tuple[int, int]:
    """dsh in a child whose controlling terminal is a new pty; returns (pid, master fd)."""
    import pty

    argv = [sys.executable, "-m", "dsh", "--config", str(config), *args]
    env = _env()
    pid, master = pty.fork()
    if pid == 0:  # the child: exec at once
        os.execve(sys.executable, argv, env)
    return pid, master


def _read_until(master: int, pattern: str, timeout: float) -> str:
    shown = ""
    deadline = time.monotonic() + timeout
    while pattern not in shown and time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.05)
        if ready:
            try:
                shown += os.read(master, 65536).decode("utf-8", errors="replace")
            except OSError:
                break
    return shown


def _wait(pid: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def _tool_results(tmp_path: Path) -> list[dict[str, Any]]:
    [ledger] = (tmp_path / "sessions").glob("*.jsonl")
    return [e for e in map(json.loads, ledger.read_text().splitlines())
            if e["type"] == "tool/result"]


QUESTION = "dsh: run_command wants to run `rm x.txt` in "
ASKS = "[r] no, and say why: "


def test_the_approval_question_stays_on_screen_until_answered(tmp_path: Path) -> None:
    config = _config(tmp_path)
    (tmp_path / "ws" / "x.txt").write_text("keep\n")
    model = _script(tmp_path, {"tool_calls": [{"name": "run_command",
                                               "arguments": {"command": "rm x.txt"}}]},
                    {"text": "done"})
    pid, master = _spawn_on_a_terminal(config, "run", "-m", model, "clean")
    try:
        shown = _read_until(master, ASKS, 30)
        assert QUESTION in shown, shown
        # The status line would redraw (\r…\x1b[K) ten times a second: nothing may come.
        later = _read_until(master, "\x1b[K", 0.8)
        assert later == "", repr(later)
        os.write(master, b"n\n")
        code = _wait(pid, 30)
        _read_until(master, "never", 0.2)
    finally:
        os.close(master)
    assert code == 0
    [result] = _tool_results(tmp_path)
    assert result["status"] == "error" and "the person refused it" in (
        result["output"])
    assert (tmp_path / "ws" / "x.txt").exists()


def test_the_time_limit_ends_the_wait_for_an_answer(tmp_path: Path) -> None:
    config = _config(tmp_path)
    (tmp_path / "ws" / "x.txt").write_text("keep\n")
    model = _script(tmp_path, {"tool_calls": [{"name": "run_command",
                                               "arguments": {"command": "rm x.txt"}}]},
                    {"text": "done"})
    pid, master = _spawn_on_a_terminal(config, "run", "-m", model, "--timeout", "1.5", "clean")
    try:
        start = time.monotonic()
        shown = _read_until(master, ASKS, 30)
        assert QUESTION in shown, shown
        code = _wait(pid, 20)
        took = time.monotonic() - start
        rest = _read_until(master, "never", 0.3)
    finally:
        os.close(master)
    assert code == 3, rest
    assert took < 15
    assert "(no answer: " in rest
    [result] = _tool_results(tmp_path)
    # the run's time limit cut the call off: interrupted, and the output says it never ran
    assert result["status"] == "interrupted"
    assert result["output"].startswith("run_command was not run: no answer to the approval "
                                       "question before ")
    assert (tmp_path / "ws" / "x.txt").exists()


def test_sigterm_while_the_question_waits_ends_the_run_with_143(tmp_path: Path) -> None:
    config = _config(tmp_path)
    (tmp_path / "ws" / "x.txt").write_text("keep\n")
    model = _script(tmp_path, {"tool_calls": [{"name": "run_command",
                                               "arguments": {"command": "rm x.txt"}}]},
                    {"text": "done"})
    pid, master = _spawn_on_a_terminal(config, "run", "-m", model, "clean")
    try:
        assert QUESTION in _read_until(master, ASKS, 30)
        os.kill(pid, signal.SIGTERM)
        code = _wait(pid, 20)
        rest = _read_until(master, "never", 0.3)
    finally:
        os.close(master)
    assert code == 143, rest
    assert "dsh: terminated by SIGTERM (aborted); session " in rest
    [ledger] = (tmp_path / "sessions").glob("*.jsonl")
    last = json.loads(ledger.read_text().splitlines()[-1])
    assert (last["type"], last["outcome"]) == ("turn/end", "aborted")
    assert (tmp_path / "ws" / "x.txt").exists()
