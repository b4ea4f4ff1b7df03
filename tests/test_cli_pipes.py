"""The command line as a real process: pipes, a closed stdout, SIGINT, exit codes, start-up.

Each test runs ``python -m dsh`` (the installed package) in a subprocess, with a config that
loads small plugin modules from a temporary directory on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import pty
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

DSH = [sys.executable, "-m", "dsh"]

SLOW_PLUGIN = '''
import os, time
from dsh import hookimpl

@hookimpl
def register_tools(register):
    def slow(seconds: float) -> str:
        """Sleep for a while."""
        marker = os.environ.get("DSHTEST_MARKER")
        if marker:
            open(marker, "w").close()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.02)
        return f"slept {seconds}"
    register(slow)
'''

REJECT_PLUGIN = '''
from dsh import hookimpl

@hookimpl
def pre_step(step):
    step.reject("no")
'''


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The subprocess environment: plugins on PYTHONPATH, a config, sessions under tmp."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "dshtest_slow.py").write_text(SLOW_PLUGIN)
    (plugins / "dshtest_reject.py").write_text(REJECT_PLUGIN)
    config = tmp_path / "dsh.toml"
    config.write_text('autoload = false\nload = ["dshtest_slow"]\n')
    e = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "DSH_LOAD_PLUGINS")}
    e.update(DSH_CONFIG=str(config), PYTHONPATH=str(plugins),
             DSHTEST_MARKER=str(tmp_path / "marker"))
    return e


@pytest.fixture
def script(tmp_path: Path) -> Callable[..., str]:
    counter = iter(range(100))

    def make(*responses: dict[str, Any]) -> str:
        path = tmp_path / f"script{next(counter)}.json"
        path.write_text(json.dumps({"responses": list(responses)}))
        return f"scripted:{path}"

    return make


def dsh(env: dict[str, str], *args: str, input: str | None = None,
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DSH, *args], env=env, input=input if input is not None else "",
                          capture_output=True, text=True, timeout=30)


def shell(env: dict[str, str], pipeline: str) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline`` in bash with pipefail; ``DSH`` in it is the dsh command."""
    return subprocess.run(["bash", "-c", "set -o pipefail; " + pipeline],
                          env={**env, "DSH": shlex.join(DSH)}, capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL)


def ledger(env: dict[str, str], session: str) -> list[dict[str, Any]]:
    path = Path(env["DSH_HOME"]) / "sessions" / f"{session}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


# --------------------------------------------------------------------------------------------
# Pipes
# --------------------------------------------------------------------------------------------


def test_stdin_pipe_prints_only_the_answer(env: dict[str, str]) -> None:
    r = shell(env, "printf 'data' | $DSH run -m echo 'summarise:'")
    assert r.returncode == 0
    assert r.stdout == "summarise:\n\n<stdin>\ndata\n</stdin>\n"
    assert r.stderr == ""


@pytest.mark.parametrize("args", ["--events", "--stream", "--json", ""])
def test_closed_stdout_ends_quietly(env: dict[str, str], tmp_path: Path, args: str) -> None:
    # 300 KB of output is far more than a pipe holds, so dsh writes after `head` has gone.
    big = tmp_path / "big.txt"
    big.write_text("".join(f"line {i} " + "x" * 60 + "\n" for i in range(5000)))
    r = shell(env, f"$DSH run -m echo {args} 'repeat:' < {big} | head -1")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert len(r.stdout.splitlines()) == 1
    # The run was stopped (or had completed), not failed: the ledger is closed cleanly.
    (path,) = (Path(env["DSH_HOME"]) / "sessions").iterdir()
    end = json.loads(path.read_text().splitlines()[-1])
    assert end["type"] == "turn/end"
    assert end["outcome"] in ("stopped", "completed")  # not "error"


def test_closed_stdout_of_a_listing_ends_quietly(env: dict[str, str], tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    big.write_text("y" * 200_000 + "\n")
    first = dsh(env, "run", "-m", "echo", "--json", input=big.read_text())
    session = json.loads(first.stdout)["session"]
    r = shell(env, f"$DSH sessions export {session} --format jsonl | head -c 10")
    assert (r.returncode, r.stderr, r.stdout) == (0, "", '{"v":1,"ty')


def test_events_first_line_names_the_session(env: dict[str, str]) -> None:
    r = shell(env, "$DSH run -m echo hi --events | head -1")
    assert r.returncode == 0 and r.stderr == ""
    first = json.loads(r.stdout)
    assert first["type"] == "session" and first["session"]


# --------------------------------------------------------------------------------------------
# Exit codes
# --------------------------------------------------------------------------------------------


def test_exit_3_on_the_step_limit_with_partial_output(env: dict[str, str],
                                                      script: Callable[..., str]) -> None:
    loop = {"text": "partial", "tool_calls": [{"name": "slow", "arguments": {"seconds": 0}}]}
    r = dsh(env, "run", "-m", script(loop, loop, loop), "--max-steps", "1", "go")
    assert r.returncode == 3
    assert r.stdout == "partial\n"
    assert "step limit reached" in r.stderr


def test_exit_4_when_a_plugin_rejects(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_text('autoload = false\nload = ["dshtest_reject"]\n')
    r = dsh(env, "run", "-m", "echo", "hi")
    assert (r.returncode, r.stdout) == (4, "")
    assert "rejected: no" in r.stderr


def test_exit_1_on_a_provider_error_with_a_result_line(env: dict[str, str],
                                                       script: Callable[..., str]) -> None:
    r = dsh(env, "run", "-m", script({"error": "boom"}), "--events", "hi")
    assert r.returncode == 1
    assert r.stderr == "dsh: error: scripted: boom\n"
    last = json.loads(r.stdout.splitlines()[-1])
    assert (last["type"], last["outcome"]) == ("result", "error")


def test_exit_2_on_bad_toml_naming_the_file(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_text("[agents\n")
    r = dsh(env, "run", "-m", "echo", "hi")
    assert r.returncode == 2
    assert r.stderr.startswith(f"dsh: error: {tmp_path / 'dsh.toml'}: invalid TOML")
    assert "Traceback" not in r.stderr


def test_exit_3_on_timeout(env: dict[str, str], script: Callable[..., str]) -> None:
    model = script({"text": "partial", "tool_calls": [{"name": "slow",
                                                       "arguments": {"seconds": 0.6}}]},
                   {"text": "never"})
    r = dsh(env, "run", "-m", model, "--timeout", "0.2", "--json", "go")
    assert r.returncode == 3
    assert "time limit reached (0.2s)" in json.loads(r.stdout)["reason"]


# --------------------------------------------------------------------------------------------
# Ctrl-C
# --------------------------------------------------------------------------------------------


def _interrupt(env: dict[str, str], model: str, times: int) -> tuple[int, str, str]:
    marker = Path(env["DSHTEST_MARKER"])
    marker.unlink(missing_ok=True)
    proc = subprocess.Popen([*DSH, "run", "-m", model, "--json", "go"], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 15
    while not marker.exists():  # the slow tool is running
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    for _ in range(times):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.1)
    out, err = proc.communicate(timeout=15)
    return proc.returncode, out, err


@pytest.fixture
def slow_model(script: Callable[..., str]) -> str:
    return script({"text": "working", "tool_calls": [{"name": "slow",
                                                      "arguments": {"seconds": 0.6}}]},
                  {"text": "done"})


def test_first_ctrl_c_aborts_the_step(env: dict[str, str], slow_model: str) -> None:
    code, out, err = _interrupt(env, slow_model, 1)
    assert code == 130
    assert "interrupted: stopping now" in err
    result = json.loads(out)
    assert (result["outcome"], result["output"]) == ("aborted", "working")
    events = ledger(env, result["session"])
    assert [e["type"] for e in events][-3:] == ["tool/result", "step/end", "turn/end"]
    assert events[-3]["status"] == "ok"  # a tool that does not poll the cancel: waited for
    again = dsh(env, "run", "-m", slow_model, "--session", result["session"], "continue")
    assert (again.returncode, again.stdout) == (0, "done\n")


def test_second_ctrl_c_aborts_and_the_ledger_resumes(env: dict[str, str],
                                                      slow_model: str) -> None:
    code, out, err = _interrupt(env, slow_model, 2)
    assert code == 130
    result = json.loads(out)
    assert (result["outcome"], result["reason"]) == ("aborted", "interrupted")
    events = ledger(env, result["session"])
    assert events[-1]["type"] == "turn/end" and events[-1]["outcome"] == "aborted"
    assert any(e["type"] == "tool/result" and e["status"] == "interrupted" for e in events)
    assert "Traceback" not in err
    shown = dsh(env, "sessions", "show", result["session"])
    assert shown.returncode == 0 and "TOOL slow interrupted" in shown.stdout
    again = dsh(env, "run", "-m", slow_model, "--session", result["session"], "continue")
    assert (again.returncode, again.stdout) == (0, "done\n")


def test_second_ctrl_c_does_not_wait_for_concurrent_tools(env: dict[str, str],
                                                          script: Callable[..., str]) -> None:
    """Two tools running at once in worker threads, for 30 s: the abort is immediate."""
    calls = [{"name": "slow", "arguments": {"seconds": 30}, "id": f"c{i}"} for i in range(2)]
    model = script({"tool_calls": calls}, {"text": "done"})
    t0 = time.monotonic()
    code, out, _ = _interrupt(env, model, 2)
    assert code == 130
    assert time.monotonic() - t0 < 10  # not the tools' 30 s
    events = ledger(env, json.loads(out)["session"])
    results = [e for e in events if e["type"] == "tool/result"]
    assert [r["status"] for r in results] == ["interrupted", "interrupted"]
    assert events[-1]["outcome"] == "aborted"


# --------------------------------------------------------------------------------------------
# The status line
# --------------------------------------------------------------------------------------------


def _stderr_on_a_terminal(env: dict[str, str], args: list[str]) -> tuple[int, str, bytes]:
    master, slave = pty.openpty()
    proc = subprocess.Popen([*DSH, *args], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    out = proc.communicate(timeout=15)[0].decode()
    os.close(master)
    return proc.returncode, out, b"".join(chunks)


@pytest.mark.parametrize("no_color", [False, True])
def test_status_line_on_a_terminal_is_erased(env: dict[str, str], script: Callable[..., str],
                                             no_color: bool) -> None:
    model = script({"tool_calls": [{"name": "slow", "arguments": {"seconds": 0.4}}]},
                   {"text": "done"})
    if no_color:
        env = {**env, "NO_COLOR": "1"}
    code, out, err = _stderr_on_a_terminal(env, ["run", "-m", model, "go"])
    assert (code, out) == (0, "done\n")
    assert b"running tool slow" in err
    assert err.endswith(b"\r\x1b[K")  # erased at the end
    assert (b"\x1b[2m" in err) is not no_color  # dim only when colour is allowed


def test_no_status_line_when_stderr_is_not_a_terminal(env: dict[str, str],
                                                      script: Callable[..., str]) -> None:
    model = script({"tool_calls": [{"name": "slow", "arguments": {"seconds": 0.3}}]},
                   {"text": "done"})
    r = dsh(env, "run", "-m", model, "go")
    assert (r.returncode, r.stdout, r.stderr) == (0, "done\n", "")


# --------------------------------------------------------------------------------------------
# Start-up
# --------------------------------------------------------------------------------------------

PROBE = """
import sys
from dsh.cli.root import main
sys.argv = ["dsh", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
heavy = ("httpx", "cattrs", "pluggy", "dsh.app", "dsh.manager", "dsh.config")
print(sorted(m for m in heavy if m in sys.modules), file=sys.stderr)
"""


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_load_no_plugin(env: dict[str, str], flag: str) -> None:
    r = subprocess.run([sys.executable, "-c", PROBE, flag], env=env, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0
    assert r.stderr.strip() == "[]"
    assert r.stdout.startswith("Usage: dsh" if flag == "--help" else "dsh ")
