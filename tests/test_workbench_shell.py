"""dsh-shell's ``run_command`` with shell syntax: ``bash -c`` under the kernel sandbox, each
line classified by a real Bash parser (tree-sitter-bash, :mod:`dsh_shell.syntax`).

A read-only line (every program on the allowlist, no file written, nothing computed) runs at
once in mode ``ask`` with no terminal; any other line is a ``command`` for the approval
service — refused without a terminal, with nothing changed on disk, and run with ``--yes`` or
in ``full-auto``. Without the sandbox (policy ``off``, no backend) or with ``shell = "never"``
shell operators are refused as they always were. Tests that run a shell skip where this
machine has no sandbox backend (``tests/procs.py``); the classification itself needs only the
grammar.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dsh.core.errors import ToolError
from dsh.ledger.events import ToolReturned
from dsh.run.app import App
from dsh.run.app import RunResult
from tests.procs import needs_sandbox
from tests.workbench import shell_apps

dsh_shell = pytest.importorskip("dsh_shell", reason="pip install ./plugins/dsh-shell")
from dsh_shell import commands  # noqa: E402
from dsh_shell import syntax  # noqa: E402

NO_TERMINAL = "there is no terminal to ask on"


@pytest.fixture(autouse=True)
def _discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DSH_LOAD_PLUGINS", raising=False)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "x.txt").write_text("hello from x\nsecond line\n")
    return root


@pytest.fixture
def make(tmp_path: Path, ws: Path) -> Callable[..., App]:
    """``make(sandbox=…, **shell_settings)``: agent ``a`` with the shell tools."""
    return shell_apps(tmp_path, ws)


def tool(app: App, name: str = "run_command") -> Callable[..., str]:
    return app.agent("a").tools[name].fn


def results(app: App, run: RunResult) -> list[ToolReturned]:
    return [e for e in app.store.read(run.session_id) if isinstance(e, ToolReturned)]


def decisions(app: App, run: RunResult) -> list[tuple[str, bool, str]]:
    return [(e.data["action"], e.data["allowed"], e.data["by"])
            for e in app.store.read(run.session_id)
            if getattr(e, "tag", "") == "x/dsh.tools/approval"]


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(root.rglob("*"))}


def call(script: Callable[..., str], command: str) -> str:
    return script({"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]},
                  {"text": "done"})


# --------------------------------------------------------------------------------------------
# The classification (the grammar only: no sandbox needed)
# --------------------------------------------------------------------------------------------

ALLOW = {"ls", "cat", "echo", "pwd", "grep", "head", "tail", "wc"}


def classify(line: str) -> syntax.Analysis:
    return syntax.analyze(line, lambda name: None if name in ALLOW else
                          "not on the allowlist (plugins.shell.allow)")


@pytest.mark.parametrize("line", [
    "ls | wc -l",
    "cat x.txt | grep -n hello | head -1",
    "ls -la 2>&1 | tail -3",
    "grep -r TODO . > /dev/null 2>&1 && echo found || echo none",
    "ls no-such 2>/dev/null; echo $?",
    "(ls; pwd) && { echo a; }",
    "if grep -q hello x.txt; then echo yes; else echo no; fi",
    "for f in *.txt; do wc -l \"$f\"; done",
    "cat < x.txt | wc -c",
    "echo \"$HOME\" ${HOME} ${#HOME} ~ *.txt {a,b}",
    "echo a > >(wc -l)",
    "LC_ALL=C ls",
    "cat <<'EOF' | wc -l\n$(rm -rf .)\nEOF",  # a quoted heredoc is text
    "echo $(pwd) `ls`",
    "case $HOME in /*) echo abs;; *) echo rel;; esac",
    "ls # a comment",
])
def test_read_only_lines(line: str) -> None:
    found = classify(line)
    assert found.read_only, found.problems


@pytest.mark.parametrize(("line", "problem"), [
    ("ls > out.txt", "writes to a file (> out.txt)"),
    ("ls >> out.txt", "writes to a file"),
    ("ls &> out.txt", "writes to a file"),
    ("ls >& out.txt", "writes to a file"),
    ("ls 2> err.txt", "writes to a file"),
    ("echo hi > \"/dev/null\"", "writes to a file"),
    ("rm x.txt && ls", "rm is not on the allowlist"),
    ("cat $(which rm)", "which is not on the allowlist"),
    ("echo `rm x`", "rm is not on the allowlist"),
    ("echo hi | sh", "sh is not on the allowlist"),
    ("cat <<EOF | sh\nrm x\nEOF", "sh is not on the allowlist"),
    ("cat <<EOF\n$(rm x)\nEOF", "rm is not on the allowlist"),
    ("cat <(rm x)", "rm is not on the allowlist"),
    ("$CMD", "the command's name ($CMD) is not a plain word"),
    ("${CMD} x", "is not a plain word"),
    ("$(echo rm) x.txt", "is not a plain word"),
    ("\"rm\" x.txt", "is not a plain word"),
    ("PATH=/tmp ls", "sets PATH for the command (PATH=/tmp)"),
    ("LD_PRELOAD=/tmp/x.so ls", "sets LD_PRELOAD"),
    ("X=1", "sets the shell variable X"),
    ("x='a[$(rm x)]'; echo $((x))", "uses arithmetic"),
    ("((x=1))", "uses arithmetic"),
    ("[[ $x -eq 1 ]] && ls", "uses [[ … ]]"),
    ("echo ${X:=1}", "parameter expansion with an operator"),
    ("echo ${a[$i]}", "parameter expansion with an operator"),
    ("echo ${HOME:$n}", "parameter expansion with an operator"),
    ("for PATH in /tmp; do ls; done", "sets the shell variable PATH (for loop)"),
    ("f() { ls; }; f", "defines a function"),
    ("export X=1; ls", "declares or exports a variable"),
    ("eval ls", "eval is a shell builtin"),
    ("exec ls", "exec is a shell builtin"),
    ("source x.txt", "source is a shell builtin"),
    (". ./x.txt", ". is a shell builtin"),
    ("ls <> x.txt", "does not parse"),
    ("ls ((", "does not parse"),
    ("echo 'unclosed", "does not parse"),
    ("ls | xargs rm", "xargs is not on the allowlist"),
])
def test_lines_that_need_approval(line: str, problem: str) -> None:
    found = classify(line)
    assert not found.read_only
    assert any(problem in p for p in found.problems), found.problems


def test_an_allowlisted_builtin_that_changes_the_shell_is_never_read_only() -> None:
    """``printf -v PATH …`` and ``hash -p`` change what later names run: whatever the
    allowlist holds, they are asked about."""
    for line in ("printf -v PATH /tmp; ls", "hash -p /tmp/evil ls; ls", "cd / && ls",
                 "read x < x.txt"):
        found = syntax.analyze(line, lambda name: None)  # everything "allowlisted"
        assert not found.read_only, line


def test_the_programs_of_a_line_are_listed_in_order() -> None:
    assert classify("cat x | grep a && rm -f y; $(which ls)").programs == (
        "cat", "grep", "rm", "$(which ls)", "which")


def test_lines_without_shell_syntax_run_as_one_program() -> None:
    import shlex

    for line in ("echo 'hi there'", "python -m pytest -q", "grep -rn TODO src",
                 "git log --format=%H -1"):
        assert not syntax.needs_shell(line, shlex.split(line)), line
    for line in ("ls *.py", "echo $HOME", "X=1 ls", "time ls", "ls ~", "ls\nrm x",
                 "ls # c", "echo a\\ b"):
        assert syntax.needs_shell(line, shlex.split(line)), line
    assert syntax.needs_shell("echo 'unclosed", None)


# --------------------------------------------------------------------------------------------
# Running it: bash -c under the sandbox
# --------------------------------------------------------------------------------------------


@needs_sandbox
def test_a_pipeline_of_allowlisted_programs_runs_at_once_in_ask_mode(
        make: Callable[..., App], script: Callable[..., str], ws: Path) -> None:
    app = make()
    run = app.run("count", agent="a", model=call(script, "cat x.txt | grep -c line | wc -l"))
    assert [(r.status, r.output) for r in results(app, run)] == [
        ("ok", "exit code: 0\n--- stdout ---\n1")]
    assert decisions(app, run) == [("read", True, "mode")]
    direct = tool(app)
    assert direct(command="cat x.txt | head -1 && echo ok") == (
        "exit code: 0\n--- stdout ---\nhello from x\nok")
    assert direct(command="ls no-such 2>&1 | wc -l; ls x.txt > /dev/null && echo $?") == (
        "exit code: 0\n--- stdout ---\n1\n0")
    assert direct(command="for f in *.txt; do wc -l < \"$f\"; done") == (
        "exit code: 0\n--- stdout ---\n2")
    assert "hello" in direct(command="grep hello x.txt | cat")


@needs_sandbox
@pytest.mark.parametrize(("line", "reason"), [
    ("ls > out.txt", "writes to a file (> out.txt)"),
    ("rm x.txt && ls", "rm is not on the allowlist (plugins.shell.allow)"),
    ("cat $(which rm)", "which is not on the allowlist"),
    ("echo hi | sh", "sh is not on the allowlist"),
    ("$CMD", "the command's name ($CMD) is not a plain word"),
    ("PATH=/tmp ls", "sets PATH for the command (PATH=/tmp)"),
    ("echo hi > out.txt; ls ((", "the line does not parse as Bash"),
    ("cat <<EOF | sh\nrm x.txt\nEOF", "sh is not on the allowlist"),
])
def test_a_line_that_needs_approval_is_refused_without_a_terminal(
        make: Callable[..., App], script: Callable[..., str], ws: Path, line: str,
        reason: str) -> None:
    app = make()
    before = snapshot(ws)
    run = app.run("go", agent="a", model=call(script, line))
    [result] = results(app, run)
    assert result.status == "error"
    assert result.output.startswith("run_command was not run: it needs approval: ")
    assert reason in result.output and NO_TERMINAL in result.output
    assert decisions(app, run) == [("command", False, "no-terminal")]
    assert snapshot(ws) == before  # nothing ran: nothing changed
    with pytest.raises(ToolError, match="needs approval"):  # outside a run: asked, refused
        tool(app)(command=line)
    assert snapshot(ws) == before


@needs_sandbox
@pytest.mark.parametrize("how", ["yes", "full-auto"])
def test_with_yes_or_full_auto_they_run(make: Callable[..., App], script: Callable[..., str],
                                        ws: Path, how: str) -> None:
    app = make()
    options: dict[str, Any] = {"approve": True} if how == "yes" else {"mode": "full-auto"}

    def run(line: str) -> str:
        result = app.run("go", agent="a", model=call(script, line), **options)
        [ret] = results(app, result)
        assert ret.status == "ok", ret.output
        return ret.output

    assert run("ls > out.txt") == "exit code: 0\n(no output)"
    assert (ws / "out.txt").read_text() == "out.txt\nx.txt\n"
    assert run("rm out.txt && ls") == "exit code: 0\n--- stdout ---\nx.txt"
    assert run("echo 'echo from sh' | sh") == "exit code: 0\n--- stdout ---\nfrom sh"
    assert run("$CMD") == "exit code: 0\n(no output)"  # unset: an empty command
    assert run("PATH=/nowhere ls").startswith("exit code: 127\n--- stderr ---\n")
    assert run("cat $(which true) | wc -c").startswith("exit code: 0\n--- stdout ---\n")
    out = run("ls ((")
    assert out.startswith("exit code: 2\n--- stderr ---\n") and "syntax error" in out


@needs_sandbox
def test_the_question_shows_the_line_and_the_programs_it_runs(
        make: Callable[..., App], ws: Path) -> None:
    master, slave = os.openpty()
    try:
        run = tool(make(tty=os.ttyname(slave)))
        prompt = f"dsh: run_command wants to run `rm x.txt && ls` in {os.path.realpath(ws)}"
        shown, outcome = _answered(master, lambda: run(command="rm x.txt && ls"), prompt,
                                   b"y\n")
        assert "(rm is not on the allowlist (plugins.shell.allow))" in shown
        assert "  runs: rm, ls\n" in shown.replace("\r\n", "\n")
        assert "  sandbox: workspace-write, no network" in shown
        assert outcome == "exit code: 0\n(no output)"
        assert not (ws / "x.txt").exists()
    finally:
        os.close(master)
        os.close(slave)


@needs_sandbox
def test_read_only_mode_runs_read_only_lines_and_refuses_the_others(
        make: Callable[..., App], script: Callable[..., str], ws: Path) -> None:
    app = make()
    run = app.run("go", agent="a", model=call(script, "ls | wc -l"), mode="read-only")
    assert [(r.status, r.output) for r in results(app, run)] == [
        ("ok", "exit code: 0\n--- stdout ---\n1")]
    run = app.run("go", agent="a", model=call(script, "ls > out.txt"), mode="read-only",
                  approve=True)
    [ret] = results(app, run)
    assert ret.status == "error" and "the permission mode is read-only" in ret.output
    assert not (ws / "out.txt").exists()


@needs_sandbox
def test_the_shell_gets_no_startup_file_and_no_exported_function(
        make: Callable[..., App], ws: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``env_keep`` may pass variables, but not ones that change what bash runs: a
    ``BASH_ENV`` startup file, an exported function replacing ``ls``."""
    startup = ws / "startup.sh"
    startup.write_text("echo startup-ran > ran.txt\n")
    monkeypatch.setenv("BASH_ENV", str(startup))
    monkeypatch.setenv("BASH_FUNC_ls%%", "() { echo replaced; }")
    monkeypatch.setenv("DSH_TEST_KEPT", "kept")
    run = tool(make(env_keep=["BASH_ENV", "BASH_FUNC_*", "DSH_TEST_*"]))
    assert run(command="ls x.txt | cat; echo $DSH_TEST_KEPT") == (
        "exit code: 0\n--- stdout ---\nx.txt\nkept")
    assert not (ws / "ran.txt").exists()


@needs_sandbox
def test_a_timed_out_line_is_killed_with_everything_it_started(
        make: Callable[..., App], ws: Path) -> None:
    from tests.procs import alive_with

    marker = f"7{os.getpid()}.{time.monotonic_ns() % 10**6}"
    run = tool(make(allow=["sleep", "echo"], timeout=0.5))
    with pytest.raises(ToolError) as err:
        run(command=f"sleep {marker} & echo started; sleep {marker}")
    assert str(err.value).startswith(
        f"command timed out after 0.5s and was killed: sleep {marker} & echo started")
    deadline = time.monotonic() + 10
    while alive_with(f"sleep\0{marker}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive_with(f"sleep\0{marker}") == []


# --------------------------------------------------------------------------------------------
# No shell: shell = "never", policy off, no backend
# --------------------------------------------------------------------------------------------


def test_shell_never_keeps_the_old_refusal(make: Callable[..., App], ws: Path) -> None:
    app = make(shell="never")
    with pytest.raises(ToolError) as err:
        tool(app)(command="ls | wc -l")
    assert str(err.value).startswith("shell syntax is not supported ('|'): commands run "
                                     "without a shell")
    assert 'No shell here: the setting [plugins.shell] shell = "never"' in str(err.value)
    assert "No shell: ONE program per call" in \
        app.agent("a").tools["run_command"].description
    # without a shell, a glob is a plain word, as it always was
    assert tool(app)(command="ls *.txt").startswith("exit code: 2\n--- stderr ---\n")


def test_policy_off_means_no_shell(make: Callable[..., App], ws: Path) -> None:
    app = make(sandbox="off", allow=["ls", "wc"])
    with pytest.raises(ToolError) as err:
        tool(app)(command="ls | wc -l")
    assert str(err.value).startswith("shell syntax is not supported ('|')")
    assert "No shell here: the sandbox policy is off" in str(err.value)
    with pytest.raises(ToolError, match=r"shell syntax is not supported \('>'\)"):
        tool(app)(command="echo hi > out.txt")
    assert not (ws / "out.txt").exists()
    assert "No shell:" in app.agent("a").tools["run_command"].description


def test_no_sandbox_backend_means_no_shell(make: Callable[..., App], ws: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "_BACKEND", ["no Landlock (a test)"])
    with pytest.raises(ToolError) as err:
        tool(make())(command="ls && rm x.txt")
    assert str(err.value).startswith("shell syntax is not supported ('&&')")
    assert "No shell here: the kernel sandbox is unavailable (no Landlock (a test))" in \
        str(err.value)
    assert (ws / "x.txt").exists()


def test_no_bash_means_no_shell(make: Callable[..., App], ws: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "_BACKEND", [""])
    monkeypatch.setattr(commands, "_bash", lambda: None)
    with pytest.raises(ToolError, match=r"No shell here: bash is not installed"):
        tool(make())(command="ls | wc -l")


@needs_sandbox
def test_the_description_says_which(make: Callable[..., App]) -> None:
    description = make().agent("a").tools["run_command"].description
    assert "Shell: bash (pipes, &&, ;, redirection" in description
    assert "Runs without approval: ls, cat, echo" in description
    params = make().agent("a").tools["run_command"].parameters["properties"]
    assert params["background"] == {"type": "boolean", "default": False,
                                    "description": params["background"]["description"]}


@pytest.mark.parametrize(("value", "ok"), [("auto", True), ("never", True), ("always", False),
                                           (True, False), ("", False)])
def test_the_shell_setting_is_validated(make: Callable[..., App], value: Any, ok: bool) -> None:
    from dsh.core.errors import ConfigError

    if ok:
        make(shell=value).agent("a")
        return
    with pytest.raises(ConfigError, match=r"shell: expected one of 'auto', 'never'"):
        make(shell=value).agent("a")


def _answered(master: int, fn: Callable[[], Any], until: str,
              answer: bytes) -> tuple[str, Any]:
    """Call ``fn`` in a thread, type ``answer`` once the terminal shows ``until``; return
    what was shown and the call's result or error."""
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(fn())
        except Exception as exc:  # the refusal is a result here
            outcome.append(exc)

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    shown = _read_terminal(master, until, 30)
    assert until in shown, shown
    shown += _read_terminal(master, "say why: ", 5)
    os.write(master, answer)
    worker.join(30)
    assert not worker.is_alive(), "the question did not take the answer"
    return shown, outcome[0]


def _read_terminal(master: int, until: str, timeout: float) -> str:
    shown = ""
    deadline = time.monotonic() + timeout
    while until not in shown and time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            shown += os.read(master, 4096).decode(errors="replace")
    return shown
