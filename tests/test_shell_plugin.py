"""plugins/dsh-shell, installed as a third party's plugin would be (``pip install
./plugins/dsh-shell``, which .ci/run does): entry-point discovery, per-agent scope,
workspace confinement, command approval, limits.

Every test loads the *installed* distribution through its ``dsh`` entry point; nothing here
puts plugins/dsh-shell on sys.path. In-process apps point the approval terminal (``tty``) at
a path that cannot be opened, so no test ever prompts the developer's terminal; the real
``/dev/tty`` refusal is proved in a child process that has no controlling terminal.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import select
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dsh.core.errors import ConfigError
from dsh.core.errors import ToolError
from dsh.ledger.events import ToolReturned
from dsh.run.app import App
from dsh.run.app import RunResult
from tests.procs import alive_with as _alive_with  # noqa: E402

try:
    import dsh_shell
except ImportError:  # reported by the autouse fixture below, as a failure, not a skip
    dsh_shell = None  # type: ignore[assignment]

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "plugins" / "dsh-shell"
INSTALL = (
    f"dsh-shell is not installed: run `{sys.executable} -m pip install {SOURCE}` "
    "(.ci/run does this before the tests). These tests load the installed distribution "
    "through its `dsh` entry point, as a third party's plugin would be loaded."
)
REFUSED = ("run_command was not run: 'rm' needs approval: not on the allowlist "
           "(plugins.shell.allow); there is no terminal to ask on; the person may rerun with "
           "--mode full-auto or --yes; do not retry it")
SHELL_TOOLS = {"run_command", "read_file", "write_file", "edit_file", "multi_edit",
               "apply_patch", "grep", "glob", "list_dir", "job_output", "job_kill", "ask_user"}


@pytest.fixture(autouse=True)
def _require_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    if dsh_shell is None:
        pytest.fail(INSTALL, pytrace=False)
    # Discovery must be the real thing: autoload on, no allow list narrowing it.
    monkeypatch.delenv("DSH_LOAD_PLUGINS", raising=False)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """The workspace, with one file; ``tmp_path/outside.txt`` is a file outside it."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "x.txt").write_text("hello from x\n")
    (tmp_path / "outside.txt").write_text("outside, keep me\n")
    return root


@pytest.fixture
def make(tmp_path: Path, ws: Path) -> Callable[..., App]:
    """``make(**shell_settings)``: agents ``a`` (shell) and ``b`` (no plugins)."""

    def build(agents: dict[str, Any] | None = None, **shell: Any) -> App:
        settings = {"workspace": str(ws), "tty": str(tmp_path / "no-terminal"), **shell}
        return App.from_config({
            "sessions_dir": str(tmp_path / "sessions"),
            "plugins": {"shell": settings},
            "agents": agents or {"a": {"plugins": ["shell"]}, "b": {"plugins": []}},
        })

    return build


def tool(app: App, name: str, agent: str = "a") -> Callable[..., str]:
    return app.agent(agent).tools[name].fn


def results(app: App, run: RunResult) -> list[ToolReturned]:
    return [e for e in app.store.read(run.session_id) if isinstance(e, ToolReturned)]


# --------------------------------------------------------------------------------------------
# Installation and discovery
# --------------------------------------------------------------------------------------------


def test_installed_and_discovered_through_entry_point(make: Callable[..., App]) -> None:
    dist = importlib.metadata.distribution("dsh-shell")
    eps = [ep for ep in dist.entry_points if ep.group == "dsh"]
    assert [(ep.name, ep.value) for ep in eps] == [("shell", "dsh_shell")]
    app = make()
    record = next((r for r in app.plugins if r.name == "shell"), None)
    assert record is not None, [r.label for r in app.plugins]
    assert (record.dist, record.version, record.module, record.error) == (
        "dsh-shell", dist.version, "dsh_shell", None)
    assert record.obj is dsh_shell and dist.version == dsh_shell.__version__
    assert record.label == f"shell (dsh-shell {dist.version})"


def test_installed_copy_is_not_stale() -> None:
    """The tests exercise the installed copy; make sure it is the code in this checkout."""
    installed = Path(dsh_shell.__file__).parent
    for src in sorted((SOURCE / "dsh_shell").glob("*.py")):
        copy = installed / src.name
        assert copy.exists() and copy.read_bytes() == src.read_bytes(), (
            f"installed dsh-shell ({installed}) differs from {src}: reinstall it with "
            f"`{sys.executable} -m pip install {SOURCE}`")


def test_register_tools_reaches_only_agents_that_enable_it(make: Callable[..., App]) -> None:
    app = make(agents={"a": {"plugins": ["shell"]}, "b": {"plugins": []}, "c": {}})
    assert set(app.agent("a").tools) == SHELL_TOOLS
    assert {t.plugin for t in app.agent("a").tools.values()} == {"shell"}
    assert not SHELL_TOOLS & set(app.agent("b").tools)
    assert "shell" not in app.agent("b").plugin_names
    # An agent listing no plugins gets every installed one.
    assert SHELL_TOOLS <= set(app.agent("c").tools)


def test_scripted_run_without_the_plugin_gets_unknown_tool(
        make: Callable[..., App], script: Callable[..., str]) -> None:
    app = make()
    model = script({"tool_calls": [{"name": "read_file", "arguments": {"path": "x.txt"}}]},
                   {"text": "done"})
    run = app.run("read x", agent="b", model=model)
    assert (run.outcome, run.output) == ("completed", "done")
    [result] = results(app, run)
    assert (result.status, result.output) == ("error", "unknown tool 'read_file'")

    run = app.run("read x", agent="a", model=model)
    assert (run.outcome, run.output) == ("completed", "done")
    [result] = results(app, run)
    assert (result.status, result.output) == ("ok", "hello from x\n")


def test_each_agent_has_its_own_settings(make: Callable[..., App], tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.txt").write_text("hello from other\n")
    app = make(agents={
        "a": {"plugins": ["shell"]},
        "o": {"plugins": ["shell"], "plugin_settings": {"shell": {"workspace": str(other),
                                                                  "allow": ["pwd"]}}},
    })
    assert tool(app, "read_file", "a")(path="x.txt") == "hello from x\n"
    assert tool(app, "read_file", "o")(path="x.txt") == "hello from other\n"
    assert str(other) in tool(app, "run_command", "o")(command="pwd")
    with pytest.raises(ToolError, match="'echo' needs approval"):
        tool(app, "run_command", "o")(command="echo hi")
    assert "Runs without approval: pwd." in app.agent("o").tools["run_command"].description


def test_default_workspace_is_the_current_directory(
        make: Callable[..., App], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = App.from_config({"sessions_dir": str(tmp_path / "s"),
                           "agents": {"a": {"plugins": ["shell"]}}})
    monkeypatch.chdir(tmp_path)
    assert tool(app, "read_file")(path="outside.txt") == "outside, keep me\n"
    monkeypatch.chdir(tmp_path / "ws")  # resolved per call, not at assembly
    assert tool(app, "read_file")(path="x.txt") == "hello from x\n"


@pytest.mark.parametrize(("settings", "message"), [
    ({"alow": ["ls"]}, "unknown key 'alow'; did you mean 'allow'"),
    ({"allow": "ls"}, "allow: expected a list of command names"),
    ({"allow": ["/bin/ls"]}, "allow: expected a list of command names"),
    ({"timeout": 0}, "timeout: expected a positive number, got 0"),
    ({"timeout": True}, "timeout: expected a positive number"),
    ({"max_output": 1.5}, "max_output: expected a positive integer"),
    ({"workspace": 3}, "workspace: expected a non-empty string"),
    ({"env_keep": "TOKEN"}, "env_keep: expected a list of environment variable names"),
])
def test_bad_settings_are_config_errors(make: Callable[..., App], settings: dict[str, Any],
                                        message: str) -> None:
    with pytest.raises(ConfigError, match=r"\[plugins.shell, agent a\].*" + _re(message)):
        make(**settings).agent("a")


def _re(text: str) -> str:
    import re

    return re.escape(text)


# --------------------------------------------------------------------------------------------
# Files: confinement
# --------------------------------------------------------------------------------------------

DOTDOT = "leaves the workspace through '..'"
ABSOLUTE = "absolute paths are refused"
SYMLINK = "goes through a symlink that leads outside the workspace"


@pytest.fixture
def links(ws: Path, tmp_path: Path) -> Path:
    """Symlinks in the workspace: to the outside file, to the outside directory, dangling
    to outside, and one that stays inside."""
    (ws / "to-outside").symlink_to(tmp_path / "outside.txt")
    (ws / "outdir").symlink_to(tmp_path)
    (ws / "dangling").symlink_to(tmp_path / "ghost.txt")
    (ws / "alias").symlink_to("x.txt")
    (ws / "sub").mkdir()
    return ws


ESCAPES = [
    ("../outside.txt", DOTDOT),
    ("sub/../../outside.txt", DOTDOT),
    ("{tmp}/outside.txt", ABSOLUTE),
    ("to-outside", SYMLINK),
    ("outdir/outside.txt", SYMLINK),
    ("outdir/ws/../outside.txt", SYMLINK),
]


@pytest.mark.parametrize(("path", "message"), ESCAPES)
def test_read_file_refuses_paths_out_of_the_workspace(
        make: Callable[..., App], links: Path, tmp_path: Path, path: str, message: str) -> None:
    with pytest.raises(ToolError, match=_re(message)):
        tool(make(), "read_file")(path=path.format(tmp=tmp_path))


@pytest.mark.parametrize(("path", "message"), [*ESCAPES, ("dangling", SYMLINK),
                                               ("outdir/new.txt", SYMLINK),
                                               ("../new.txt", DOTDOT)])
def test_write_file_refuses_paths_out_of_the_workspace(
        make: Callable[..., App], links: Path, tmp_path: Path, path: str, message: str) -> None:
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ToolError, match=_re(message)):
        tool(make(), "write_file")(path=path.format(tmp=tmp_path), content="pwned\n")
    assert (tmp_path / "outside.txt").read_text() == "outside, keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no ghost.txt, no new.txt


def test_refusal_reaches_the_model_as_an_error_result(
        make: Callable[..., App], script: Callable[..., str], tmp_path: Path) -> None:
    app = make()
    model = script({"tool_calls": [
        {"name": "write_file", "arguments": {"path": "../outside.txt", "content": "x"}},
        {"name": "read_file", "arguments": {"path": str(tmp_path / "outside.txt")}},
    ]}, {"text": "ok"})
    run = app.run("go", agent="a", model=model)
    assert run.outcome == "completed"
    assert [(r.status, r.output.split(":")[0]) for r in results(app, run)] == [
        ("error", "path '../outside.txt' leaves the workspace through '..'"),
        ("error", "absolute paths are refused ('" + str(tmp_path / "outside.txt") + "')"),
    ]
    assert (tmp_path / "outside.txt").read_text() == "outside, keep me\n"


def test_symlinks_inside_the_workspace_are_followed(make: Callable[..., App],
                                                   links: Path) -> None:
    app = make()
    assert tool(app, "read_file")(path="alias") == "hello from x\n"
    assert tool(app, "read_file")(path="sub/../x.txt") == "hello from x\n"
    assert tool(app, "write_file")(path="alias", content="new\n").startswith(
        "replaced alias (4 bytes)\n--- a/x.txt\n+++ b/x.txt")  # the diff names the real file
    assert (links / "x.txt").read_text() == "new\n" and (links / "alias").is_symlink()


def test_a_symlink_swapped_in_after_the_check_is_not_followed(
        make: Callable[..., App], links: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulate the race: the check saw a plain directory, the open finds a symlink."""
    monkeypatch.setattr(dsh_shell.workspace, "resolve", lambda root, path: "outdir/outside.txt")
    app = make()
    with pytest.raises(ToolError, match="changed while it was being opened"):
        tool(app, "read_file")(path="sub/outside.txt")
    with pytest.raises(ToolError, match="changed while it was being opened"):
        tool(app, "write_file")(path="sub/outside.txt", content="pwned")
    assert (links.parent / "outside.txt").read_text() == "outside, keep me\n"


def test_write_file_creates_parents_and_says_what_it_did(make: Callable[..., App],
                                                         ws: Path) -> None:
    write = tool(make(), "write_file")
    assert write(path="a/b/c.txt", content="héllo\n") == "created a/b/c.txt (7 bytes)"
    assert write(path="a/b/c.txt", content="").startswith("replaced a/b/c.txt (0 bytes)\n")
    assert (ws / "a" / "b" / "c.txt").read_text() == ""
    with pytest.raises(ToolError, match="'a' is a directory"):
        write(path="a", content="x")
    with pytest.raises(ToolError, match="the path is empty"):
        write(path="", content="x")


def test_read_file_errors(make: Callable[..., App], ws: Path) -> None:
    read = tool(make(), "read_file")
    (ws / "bin.dat").write_bytes(b"\x7fELF\0\0\1")
    (ws / "d").mkdir()
    with pytest.raises(ToolError, match="no such file in the workspace: 'nope.txt'"):
        read(path="nope.txt")
    with pytest.raises(ToolError, match="looks like a binary file"):
        read(path="bin.dat")
    with pytest.raises(ToolError, match="'d' is a directory"):
        read(path="d")
    with pytest.raises(ToolError, match="start_line 3 is past the end"):
        read(path="x.txt", start_line=3)
    os.mkfifo(ws / "fifo")
    with pytest.raises(ToolError, match="not a regular file"):  # and does not hang
        read(path="fifo")


def test_read_file_is_cut_at_a_line_and_can_continue(make: Callable[..., App],
                                                     ws: Path) -> None:
    (ws / "big.txt").write_text("".join(f"line {i:03}\n" for i in range(1, 101)))  # 9 bytes
    read = tool(make(max_read=50), "read_file")
    first = read(path="big.txt")
    assert first.startswith("line 001\n") and "line 005\n" in first and "line 006" not in first
    assert first.endswith("[read_file: cut at 50 bytes of a 900-byte file; showed lines 1-5; "
                          "call read_file with start_line=6 to continue]")
    assert read(path="big.txt", start_line=6).startswith("line 006\n")
    assert read(path="big.txt", start_line=100) == "line 100\n"
    (ws / "long.txt").write_text("x" * 80 + "\nnext\n")
    assert "showed the beginning of line 1" in read(path="long.txt")


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------


def test_allowlisted_commands_run_in_the_workspace_without_approval(
        make: Callable[..., App], ws: Path) -> None:
    run = tool(make(), "run_command")
    assert run(command="echo 'hi there'") == "exit code: 0\n--- stdout ---\nhi there"
    assert run(command="pwd") == f"exit code: 0\n--- stdout ---\n{os.path.realpath(ws)}"
    assert run(command="cat x.txt") == "exit code: 0\n--- stdout ---\nhello from x"
    out = run(command="ls no-such-file")
    assert out.startswith("exit code: 2\n--- stderr ---\nls: cannot access")
    # stdin is /dev/null: `cat` with no file ends at once instead of waiting for input.
    assert run(command="cat") == "exit code: 0\n(no output)"


def test_unapproved_command_without_terminal_is_refused(make: Callable[..., App],
                                                        ws: Path) -> None:
    with pytest.raises(ToolError) as err:
        tool(make(), "run_command")(command="rm x.txt")
    assert str(err.value) == REFUSED
    assert (ws / "x.txt").exists()


def test_approve_all_runs_unapproved_commands(
        make: Callable[..., App], script: Callable[..., str], ws: Path) -> None:
    app = make()
    model = script({"tool_calls": [{"name": "run_command", "arguments": {"command": "rm x.txt"}}]},
                   {"text": "done"})
    refused = app.run("clean", agent="a", model=model)
    assert [(r.status, r.output) for r in results(app, refused)] == [("error", REFUSED)]
    assert (ws / "x.txt").exists()

    approved = app.run("clean", agent="a", model=model, approve=True)  # dsh run --yes
    assert [(r.status, r.output) for r in results(app, approved)] == [
        ("ok", "exit code: 0\n(no output)")]
    assert not (ws / "x.txt").exists()


def test_allowlist_names_programs_not_paths(make: Callable[..., App], ws: Path) -> None:
    run = tool(make(), "run_command")
    echo = shutil.which("echo")
    assert echo is not None
    assert run(command=f"{echo} by path") == "exit code: 0\n--- stdout ---\nby path"
    fake = ws / "echo"
    fake.write_text("#!/bin/sh\necho fake\n")
    fake.chmod(0o755)
    with pytest.raises(ToolError, match=r"'echo' needs approval: '\./echo' is a path, not the "
                                        r"'echo' on PATH"):
        run(command="./echo hi")


@pytest.mark.parametrize(("command", "message"), [
    ("ls | wc -l", "shell syntax is not supported ('|')"),
    ("echo hi > out.txt", "shell syntax is not supported ('>')"),
    ("ls && rm x.txt", "shell syntax is not supported ('&&')"),
    ("echo 'unclosed", "cannot parse the command: No closing quotation"),
    ("   ", "the command is empty"),
])
def test_shell_syntax_is_refused_with_an_explanation(
        make: Callable[..., App], ws: Path, command: str, message: str) -> None:
    # shell = "never": the no-shell mode (with the sandbox active, these lines would run in
    # bash or ask: tests/test_workbench_shell.py)
    with pytest.raises(ToolError, match=_re(message)):
        tool(make(shell="never"), "run_command")(command=command)
    assert not (ws / "out.txt").exists() and (ws / "x.txt").exists()


def test_missing_program_and_shell_builtin(make: Callable[..., App]) -> None:
    run = tool(make(allow=["cd", "no-such-program-dsh"]), "run_command")
    with pytest.raises(ToolError, match="command not found: 'no-such-program-dsh'$"):
        run(command="no-such-program-dsh")
    with pytest.raises(ToolError, match="command not found: 'cd' \\(it is a shell builtin"):
        run(command="cd sub")


def test_command_timeout_kills_the_command_and_its_children(
        make: Callable[..., App], ws: Path) -> None:
    run = tool(make(allow=["sh"], timeout=0.5), "run_command")
    mark = f"30.{os.getpid()}{time.monotonic_ns() % 10**6}"  # a duration no other sleep has
    start = time.monotonic()
    with pytest.raises(ToolError) as err:
        run(command=f"sh -c 'sleep {mark} & echo $! > bg.pid; echo started; wait'")
    assert time.monotonic() - start < 10
    assert str(err.value).startswith("command timed out after 0.5s and was killed: sh -c")
    assert "--- stdout ---\nstarted" in str(err.value)  # partial output is kept
    assert (ws / "bg.pid").exists()  # the background child was started
    deadline = time.monotonic() + 5
    while _alive_with(f"sleep\0{mark}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive_with(f"sleep\0{mark}") == [], "the background child of a timed-out " \
        "command survived"


def test_aborting_the_run_kills_a_running_command(
        make: Callable[..., App], script: Callable[..., str]) -> None:
    app = make(allow=["sleep"])
    model = script({"tool_calls": [{"name": "run_command", "arguments": {"command": "sleep 30"}}]},
                   {"text": "never"})
    contexts: list[Any] = []
    timer = threading.Timer(0.3, lambda: contexts[0].abort("test"))
    start = time.monotonic()
    timer.start()
    try:
        run = app.run("sleep", agent="a", model=model, context_hook=contexts.append)
    finally:
        timer.cancel()
    assert time.monotonic() - start < 10
    assert run.outcome == "aborted"
    assert [(r.status, r.output) for r in results(app, run)] == [
        ("interrupted", "the command was killed: the run was aborted")]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie is dead, waiting for init to reap it


def test_output_is_cut_to_max_output_and_says_so(make: Callable[..., App]) -> None:
    run = tool(make(allow=["seq", "ls"], max_output=1000), "run_command")
    out = run(command="seq 1 100000")
    assert out.startswith("exit code: 0\n--- stdout (cut: 588895 bytes, showing the first 750 "
                          "and the last 250) ---\n1\n")
    assert "\n[… 587895 bytes cut …]\n" in out and out.endswith("\n99999\n100000")
    assert len(out.encode()) < 1150
    # Both streams share the budget: a short stderr is kept whole.
    out = run(command="ls x.txt no-such-file")
    assert "--- stdout ---\nx.txt" in out and "--- stderr ---\nls: cannot access" in out


def test_commands_get_an_allowlisted_environment(
        make: Callable[..., App], monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the base allowlist and what env_keep names: a variable is withheld whatever it
    is called (tests/test_shell_hardening.py scans everything a command can reach)."""
    monkeypatch.setenv("DSH_TEST_API_KEY", "sk-not-for-the-model")
    monkeypatch.setenv("DSH_TEST_GITHUB_TOKEN", "ghp-kept")
    monkeypatch.setenv("DSH_TEST_PLAIN", "withheld-too")
    monkeypatch.setenv("DSH_TEST_GIT_AUTHOR", "kept-by-pattern")
    out = tool(make(allow=["env"], env_keep=["DSH_TEST_GITHUB_TOKEN", "DSH_TEST_GIT_*"]),
               "run_command")(command="env")
    assert "DSH_TEST_GITHUB_TOKEN=ghp-kept" in out and "DSH_TEST_GIT_AUTHOR=kept-by" in out
    assert "sk-not-for-the-model" not in out and "DSH_TEST_API_KEY" not in out
    assert "DSH_TEST_PLAIN" not in out
    assert "PATH=" in out


def test_vanished_workspace_is_reported(make: Callable[..., App], tmp_path: Path) -> None:
    run = tool(make(workspace=str(tmp_path / "gone")), "run_command")
    with pytest.raises(ToolError, match="the workspace .*gone does not exist"):
        run(command="ls")


# --------------------------------------------------------------------------------------------
# Approval on a terminal
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("answer", "approved"), [(b"y\n", True), (b"YES\n", True),
                                                  (b"n\n", False), (b"\n", False)])
def test_approval_is_asked_and_read_on_the_terminal(
        make: Callable[..., App], ws: Path, answer: bytes, approved: bool) -> None:
    master, slave = os.openpty()
    try:
        run = tool(make(tty=os.ttyname(slave)), "run_command")
        prompt = f"dsh: run_command wants to run `rm x.txt` in {os.path.realpath(ws)}"
        shown, outcome = _answered(master, lambda: run(command="rm x.txt"), prompt, answer)
        if approved:
            assert outcome == "exit code: 0\n(no output)"
        else:
            assert isinstance(outcome, ToolError)
            assert "the person refused it" in str(outcome)
        assert (ws / "x.txt").exists() == (not approved)
        assert prompt + " (not on the allowlist (plugins.shell.allow))" in shown
    finally:
        os.close(master)
        os.close(slave)


def test_an_answer_typed_before_the_question_is_not_an_answer(
        make: Callable[..., App], ws: Path) -> None:
    master, slave = os.openpty()
    try:
        os.write(master, b"y\n")  # typed ahead: waits in the terminal's input queue
        run = tool(make(tty=os.ttyname(slave)), "run_command")
        shown, outcome = _answered(master, lambda: run(command="rm x.txt"),
                                   "[r] no, and say why: ", b"n\n")
        assert isinstance(outcome, ToolError) and "the person refused it" in str(outcome)
        assert (ws / "x.txt").exists()
    finally:
        os.close(master)
        os.close(slave)


def _answered(master: int, call: Callable[[], Any], until: str,
              answer: bytes) -> tuple[str, Any]:
    """Make ``call`` in a thread, type ``answer`` once the terminal shows ``until`` (the
    question drains what was typed before it), and return what was shown and the call's
    result or error."""
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(call())
        except Exception as exc:  # the refusal is the result under test
            outcome.append(exc)

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    shown = _read_terminal(master, until=until, timeout=30)
    assert until in shown, shown
    os.write(master, answer)
    worker.join(30)
    assert not worker.is_alive(), "the question did not take the answer"
    return shown + _read_terminal(master, until="\n", timeout=0.5), outcome[0]


def _read_terminal(master: int, until: str, timeout: float = 5.0) -> str:
    """What the terminal shows: the pty delivers output asynchronously, so read until
    ``until`` appears."""
    shown = ""
    deadline = time.monotonic() + timeout
    while until not in shown and time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            shown += os.read(master, 4096).decode(errors="replace")
    return shown


def test_approval_question_cannot_be_redrawn_by_the_model(make: Callable[..., App]) -> None:
    master, slave = os.openpty()
    try:
        run = tool(make(tty=os.ttyname(slave)), "run_command")
        prompt = "dsh: run_command wants to run `rm -rf 'x\\x1b[2K\\rls'` in "
        shown, outcome = _answered(master, lambda: run(command="rm -rf 'x\x1b[2K\rls'"),
                                   prompt, b"n\n")
        assert isinstance(outcome, ToolError) and "the person refused it" in str(outcome)
        assert "\x1b[2K" not in shown
    finally:
        os.close(master)
        os.close(slave)


CHILD = textwrap.dedent("""
    import json, sys
    from dsh.run.app import App

    ws, sessions, model = sys.argv[1:4]
    app = App.from_config({"sessions_dir": sessions, "plugins": {"shell": {"workspace": ws}},
                           "agents": {"a": {"plugins": ["shell"]}}})
    run = app.run("clean up", agent="a", model=model)
    out = [e.output for e in app.store.read(run.session_id) if e.type == "tool/result"]
    print(json.dumps({"outcome": run.outcome, "results": out}))
""")


def test_no_controlling_terminal_refuses_and_never_reads_stdin(
        ws: Path, tmp_path: Path, script: Callable[..., str]) -> None:
    """The default ``/dev/tty``, in a process without a controlling terminal (a new
    session): the command is refused, though stdin offers a "y"."""
    model = script({"tool_calls": [{"name": "run_command", "arguments": {"command": "rm x.txt"}}]},
                   {"text": "done"})
    env = {k: v for k, v in os.environ.items() if k != "DSH_LOAD_PLUGINS"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(ws), str(tmp_path / "sessions"), model],
        input="y\ny\n", capture_output=True, text=True, timeout=60, env=env,
        start_new_session=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"outcome": "completed", "results": [REFUSED]}
    assert (ws / "x.txt").exists()


# --------------------------------------------------------------------------------------------
# Through the command line
# --------------------------------------------------------------------------------------------


def _dsh(tmp_path: Path, ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``dsh --config … ARGS`` in a child without a controlling terminal, stdin offering "y"."""
    config = tmp_path / "dsh.toml"
    config.write_text(textwrap.dedent(f"""
        sessions_dir = {json.dumps(str(tmp_path / "sessions"))}
        [plugins.shell]
        workspace = {json.dumps(str(ws))}
        [agents.a]
        plugins = ["shell"]
        [agents.b]
        plugins = []
    """))
    env = {k: v for k, v in os.environ.items() if k not in ("DSH_LOAD_PLUGINS", "DSH_CONFIG")}
    return subprocess.run([sys.executable, "-m", "dsh", "--config", str(config), *args],
                          input="y\n", capture_output=True, text=True, timeout=60, env=env,
                          start_new_session=True)


def test_cli_plugins_and_tools_show_the_scope(ws: Path, tmp_path: Path) -> None:
    proc = _dsh(tmp_path, ws, "plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    [row] = [r for r in json.loads(proc.stdout) if r["name"] == "shell"]
    assert (row["dist"], row["version"], row["error"]) == ("dsh-shell", dsh_shell.__version__,
                                                           None)
    assert "a" in row["agents"] and "b" not in row["agents"]
    proc = _dsh(tmp_path, ws, "tools", "-a", "a", "--json")
    assert proc.returncode == 0, proc.stderr
    assert {t["name"] for t in json.loads(proc.stdout)} == SHELL_TOOLS
    proc = _dsh(tmp_path, ws, "tools", "-a", "b", "--json")
    assert proc.returncode == 0, proc.stderr
    assert not SHELL_TOOLS & {t["name"] for t in json.loads(proc.stdout)}


def test_cli_run_refuses_without_yes_and_runs_with_it(
        ws: Path, tmp_path: Path, script: Callable[..., str]) -> None:
    model = script({"tool_calls": [{"name": "run_command", "arguments": {"command": "rm x.txt"}}]},
                   {"text": "done"})
    outputs = []
    for extra in ([], ["--yes"]):
        proc = _dsh(tmp_path, ws, "run", "-a", "a", "-m", model, "--json", *extra, "clean up")
        assert proc.returncode == 0, proc.stderr
        summary = json.loads(proc.stdout)
        assert (summary["outcome"], summary["output"]) == ("completed", "done")
        lines = [json.loads(line) for line in Path(summary["path"]).read_text().splitlines()]
        outputs.append([(e["status"], e["output"]) for e in lines if e["type"] == "tool/result"])
        assert (ws / "x.txt").exists() == (not extra)  # removed only with --yes
    assert outputs == [[("error", REFUSED)], [("ok", "exit code: 0\n(no output)")]]


