"""A tool call owns its processes: everything a confined command starts is gone when it ends,
and it sees no process outside its sandbox.

Observed from outside, by a marker in the argv of each process a command starts: after the
call returns (with a short poll, never a timing assertion) no process carrying the marker is
alive. Inside the sandbox, pids are those of the command's own PID namespace, so a test never
trusts a pid the command reports: only ``/proc`` as the test process sees it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from dsh.sandbox.policy import Policy
from dsh.sandbox.spawn import Popen
from tests.procs import alive_with
from tests.procs import needs_namespaces
from tests.procs import needs_sandbox

SRC = str(Path(__file__).resolve().parents[1])


def gone(marker: str, within: float = 10.0) -> list[int]:
    """Poll until no process with ``marker`` is alive; return the survivors (kill them)."""
    deadline = time.monotonic() + within
    while alive_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = alive_with(marker)
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    return survivors


def sleeper(marker: str, flag: str, ignore: bool = False) -> str:
    """A shell word: a Python process that marks ``flag`` (a file) and sleeps 600 s with
    ``marker`` in its argv, ignoring SIGTERM and SIGHUP when ``ignore``."""
    code = ("import signal, sys, time; "
            + ("[signal.signal(s, signal.SIG_IGN) for s in (1, 15)]; " if ignore else "")
            + "open(sys.argv[1], 'w').close(); time.sleep(600)")
    return f"{sys.executable} -c \"{code}\" {flag} {marker}"


DOUBLE_FORK = ("import os, sys, time\n"
               "if os.fork() == 0:\n"
               "    os.setsid()\n"
               "    if os.fork() == 0:\n"
               "        open(sys.argv[1], \"w\").close(); time.sleep(600)\n"
               "    os._exit(0)\n")


def escapes(marker: str) -> str:
    """A command that starts five processes meant to outlive it, each its own way, waits
    until each has started, then exits 0."""
    return textwrap.dedent(f"""
        ({sleeper(marker, 'f1')} &)
        setsid {sleeper(marker, 'f2')} &
        nohup {sleeper(marker, 'f3', ignore=True)} >/dev/null 2>&1 &
        (trap '' TERM HUP; exec {sleeper(marker, 'f4', ignore=True)}) &
        {sys.executable} -c '{DOUBLE_FORK}' f5 {marker}
        i=0
        while [ $i -lt 400 ] && ! [ -e f1 -a -e f2 -a -e f3 -a -e f4 -a -e f5 ]; do
            sleep 0.05; i=$((i+1))
        done
        exit 0
    """)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@needs_sandbox
@needs_namespaces
@pytest.mark.parametrize("launcher", [False, True], ids=["in-child", "launcher"])
def test_nothing_a_command_starts_outlives_it(ws: Path, launcher: bool) -> None:
    marker = f"dsh-test-{uuid.uuid4().hex}"
    proc = Popen(["sh", "-c", escapes(marker)], Policy(), workspace=str(ws),
                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 launcher=launcher)
    out, err = proc.communicate(timeout=120)  # returns: no survivor holds the pipes
    assert proc.returncode == 0, err
    assert sorted(p.name for p in ws.iterdir()) == ["f1", "f2", "f3", "f4", "f5"], err
    assert gone(marker) == []


@needs_sandbox
@needs_namespaces
def test_killing_the_process_kills_everything_it_started(ws: Path) -> None:
    """``Popen.kill`` (dsh sandbox run on Ctrl-C, dsh-claude's timeout) reaches the tree."""
    marker = f"dsh-test-{uuid.uuid4().hex}"
    proc = Popen(["sh", "-c", escapes(marker).replace("exit 0", "sleep 600")], Policy(),
                 workspace=str(ws), stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(list(ws.iterdir())) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(alive_with(marker)) >= 5  # the five, and the shell whose script names it
    proc.kill()
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert gone(marker) == []


@needs_sandbox
@needs_namespaces
def test_when_dsh_dies_its_commands_processes_die(ws: Path, tmp_path: Path) -> None:
    """dsh killed outright (SIGKILL: no handler runs): the relay notices and ends the tree."""
    marker = f"dsh-test-{uuid.uuid4().hex}"
    host = textwrap.dedent(f"""
        import subprocess, sys, time
        sys.path.insert(0, {SRC!r})
        from dsh.sandbox.policy import Policy
        from dsh.sandbox.spawn import Popen
        proc = Popen(["sh", "-c", sys.argv[1]], Policy(), workspace={str(ws)!r},
                     stdin=subprocess.DEVNULL)
        print("started", flush=True)
        time.sleep(600)
    """)
    script = escapes(marker).replace("exit 0", "sleep 600")
    dsh = subprocess.Popen([sys.executable, "-c", host, script], stdout=subprocess.PIPE,
                           text=True)
    try:
        assert dsh.stdout is not None and dsh.stdout.readline() == "started\n"
        deadline = time.monotonic() + 60
        while len(alive_with(marker)) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(alive_with(marker)) >= 5
    finally:
        dsh.kill()
        dsh.communicate()
    assert gone(marker) == []


@needs_sandbox
@needs_namespaces
@pytest.mark.parametrize("launcher", [False, True], ids=["in-child", "launcher"])
def test_a_confined_process_sees_no_process_outside_its_sandbox(ws: Path,
                                                                launcher: bool) -> None:
    marker = f"dsh-test-secret-argv-{uuid.uuid4().hex}"
    outside = subprocess.Popen(["sleep", "600", marker], stderr=subprocess.DEVNULL)
    try:
        code = f"""
            import json, os
            seen = {{}}
            for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
                try:
                    with open(f"/proc/{{pid}}/cmdline", "rb") as f:
                        seen[pid] = f.read().decode(errors="replace")
                except OSError as exc:
                    seen[pid] = type(exc).__name__
            for pid in ({outside.pid}, {os.getpid()}):
                try:
                    open(f"/proc/{{pid}}/cmdline", "rb").read()
                    seen["direct " + str(pid)] = "read"
                except OSError as exc:
                    seen["direct " + str(pid)] = type(exc).__name__
            seen["ppid"] = os.getppid()
            print(json.dumps(seen))
        """
        proc = Popen([sys.executable, "-c", textwrap.dedent(code)], Policy(),
                     workspace=str(ws), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                     launcher=launcher)
        out, _ = proc.communicate(timeout=60)
    finally:
        outside.kill()
        outside.wait()
    seen = json.loads(out)
    assert marker not in out.decode()
    assert seen.pop(f"direct {outside.pid}") != "read"
    assert seen.pop(f"direct {os.getpid()}") != "read"
    assert seen.pop("ppid") == 1  # its parent is its namespace's init
    # only the namespace's own processes: its init (showing no command line) and itself
    assert seen.get("1", "?").strip("\0") == ""
    assert len(seen) == 2 and sys.executable in seen["2"], seen


@needs_sandbox
@needs_namespaces
@pytest.mark.parametrize("launcher", [False, True], ids=["in-child", "launcher"])
def test_exit_status_and_signals_are_the_commands_own(ws: Path, launcher: bool) -> None:
    def run(script: str, **kwargs: Any) -> subprocess.Popen[bytes]:
        return Popen(["sh", "-c", script], Policy(), workspace=str(ws),
                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, launcher=launcher,
                     **kwargs)

    proc = run("echo $$ $PPID")  # the command's own namespace, under its init
    assert proc.communicate(timeout=60)[0] == b"2 1\n"
    for script, code in (("exit 7", 7), ("kill -TERM $$", -signal.SIGTERM),
                         ("kill -KILL $$", -signal.SIGKILL), ("true", 0)):
        proc = run(script)
        proc.communicate(timeout=60)
        assert proc.returncode == code, script
    # a signal to the process dsh holds reaches the command, which may handle it
    proc = run("trap 'echo got-term; exit 3' TERM; echo ready; while :; do sleep 0.05; done")
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    proc.terminate()
    out, _ = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (3, b"got-term\n")
    proc = run("echo ready; exec sleep 600")
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGINT


@needs_sandbox
@needs_namespaces
def test_a_run_command_call_leaves_nothing_running_after_dsh_run(tmp_path: Path) -> None:
    """End to end: the scripted model's run_command starts background processes; once the
    call has returned — before the run even ends — none of them is alive."""
    pytest.importorskip("dsh_shell", reason="pip install ./plugins/dsh-shell")
    marker = f"dsh-test-{uuid.uuid4().hex}"
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "escape.sh").write_text(escapes(marker))
    checker = (f"{sys.executable} -c \"import os; print(sum(1 for p in os.listdir('/proc') "
               f"if p.isdigit()))\"")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"tool_calls": [{"name": "run_command", "arguments": {"command": "sh escape.sh"}}]},
        {"tool_calls": [{"name": "run_command", "arguments": {"command": checker}}]},
        {"text": "done"}]}))
    sessions = tmp_path / "sessions"
    config = tmp_path / "dsh.toml"
    config.write_text(f'sessions_dir = {json.dumps(str(sessions))}\n'
                      f'[plugins.shell]\nworkspace = {json.dumps(str(ws))}\n'
                      f'allow = ["sh", {json.dumps(os.path.basename(sys.executable))}]\n')
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("DSH_LOAD_PLUGINS", None)
    proc = subprocess.run([sys.executable, "-m", "dsh", "--config", str(config), "run",
                           "--yes", "-m", f"scripted:{script}", "go"], env=env, cwd=ws,
                          capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert gone(marker) == []
    assert {"f1", "f2", "f3", "f4", "f5"} <= {p.name for p in ws.iterdir()}
    [ledger] = sessions.glob("*.jsonl")
    events = [json.loads(line) for line in ledger.read_text().splitlines()]
    first, second = [e["output"] for e in events if e["type"] == "tool/result"]
    assert first.startswith("exit code: 0")
    # the second call sees its own processes only (its init, the shell-less python): 2
    assert second == "exit code: 0\n--- stdout ---\n2"
    records = [e["data"] for e in events if e["type"] == "x/shell/sandbox"]
    assert [r["namespaces"] for r in records] == [["user", "mount", "pid"]] * 2
