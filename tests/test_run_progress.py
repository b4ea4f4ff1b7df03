"""``dsh run`` shows its work on a terminal (docs/cli.md, "What a run shows on a terminal"):
tool calls and their ends, approvals, permission-mode changes and retries of a model request
stay on stderr as lines — never on stdout, never when stderr is not a terminal, not with
``-q`` — with the controls of what the model or the server wrote made visible.

Driven on a real pseudo-terminal (pexpect) with stdout redirected to a file inside the pty's
shell, the model scripted or a loopback HTTP server (tests/servers.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import openai_completion

pexpect = pytest.importorskip("pexpect",
                              reason="pexpect is in the test extra: pip install -e '.[test]'")
pytest.importorskip("dsh_shell", reason="dsh-shell is installed by .ci/run")

YES_NOTE = ("dsh: --yes: every tool call that would ask is approved in this run (mode ask: "
            "calls the mode refuses stay refused)")


class Env:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.work = tmp / "work"
        self.work.mkdir()
        self.config = tmp / "config.toml"
        self.out = tmp / "out.txt"
        # dsh-shell by its registered name (its events are recorded as `shell`), alone
        self.env = {**{k: v for k, v in os.environ.items() if k not in ("DSH_CONFIG",)},
                    "DSH_CONFIG": str(self.config), "DSH_HOME": str(tmp / "home"),
                    "DSH_LOAD_PLUGINS": "shell", "NO_COLOR": "1", "OPENAI_API_KEY": "sk-test"}

    def configure(self, *responses: dict[str, Any], server: ScriptedServer | None = None,
                  top: tuple[str, ...] = ('compaction = "off"',)) -> None:
        script = self.tmp / "script.json"
        script.write_text(json.dumps({"responses": list(responses)}))
        lines = [f'model = "scripted:{script}"', "autoload = true", *top,
                 f'sessions_dir = "{self.tmp / "sessions"}"']
        if server is not None:
            lines[0] = 'model = "oa"'
            lines += ["[models.oa]", 'adapter = "openai"', 'model = "gpt-4o"',
                      f'base_url = "{server.url}/v1"', "retries = 4", "retry_base = 0.05",
                      "retry_cap = 0.2", "max_retry_wait = 0.3"]
        lines += ["[plugins.shell]", f'workspace = "{self.work}"']
        self.config.write_text("\n".join(lines) + "\n")

    def spawn(self, *args: str) -> Any:
        """``dsh run ARGS > out.txt`` on a pseudo-terminal: stderr is the terminal."""
        import shlex

        line = " ".join(shlex.quote(a) for a in (sys.executable, "-m", "dsh", "run", *args))
        return pexpect.spawn("sh", ["-c", f"{line} > {shlex.quote(str(self.out))}"],
                             env=self.env, encoding="utf-8", timeout=60, dimensions=(40, 160))

    def transcript(self, *args: str) -> str:
        """Everything the terminal received from ``dsh run ARGS`` (stdout went to a file)."""
        child = self.spawn(*args)
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0, child.before
        return str(child.before)

    def piped(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dsh", "run", *args], env=self.env,
                              capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def _calls(*commands: str) -> list[dict[str, Any]]:
    return [{"tool_calls": [{"name": "run_command", "arguments": {"command": c}}]}
            for c in commands]


def test_tool_calls_stay_on_the_terminal_and_never_reach_stdout(env: Env) -> None:
    env.configure(*_calls("echo hi", "false"),
                  {"tool_calls": [{"name": "read_file", "arguments": {"path": "nope.txt"}}]},
                  {"text": "done"})
    seen = env.transcript("--yes", "go")
    # each line as it stays on screen (the status line before it erased: \r\x1b[K)
    lines = [line.split("\r")[-1].replace("\x1b[K", "") for line in seen.split("\r\n")]
    assert "→ run_command echo hi" in lines
    assert any(line.startswith("← ok ") and line.endswith(" ms") for line in lines), lines
    assert "→ run_command false" in lines
    assert any(line.startswith("← exit code 1 · ") for line in lines), lines
    assert "→ read_file nope.txt" in lines
    assert any(line.startswith("← error ") for line in lines), lines
    assert env.out.read_text() == "done\n"  # stdout has the answer, nothing else

    # -q: the same run without the lines (the status line may still pass by)
    quiet = env.transcript("-q", "--yes", "go")
    assert "→ run_command" not in quiet and "← " not in quiet
    assert env.out.read_text() == "done\n"

    # stderr not a terminal: exactly what dsh printed before
    piped = env.piped("--yes", "go")
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == "done\n"
    assert piped.stderr == YES_NOTE + "\n"


def test_an_approval_answered_and_a_mode_change_are_shown(env: Env) -> None:
    env.configure(*_calls("touch made"), {"tool_calls": [
        {"name": "propose_plan", "arguments": {"plan": "1. edit"}}]}, {"text": "done"})
    child = env.spawn("go")
    child.expect(r"run `touch made` in .*\[r\] no, and say why: ")
    child.sendline("y")
    child.expect(r"dsh: run_command approved: the person approved it")
    child.expect(pexpect.EOF)
    assert (env.work / "made").exists()

    env.configure({"tool_calls": [{"name": "propose_plan", "arguments": {"plan": "1. go"}}]},
                  {"text": "planned"})
    seen = env.transcript("--mode", "plan", "--yes", "plan it")
    assert "dsh: permission mode: plan → ask" in seen
    assert env.out.read_text() == "planned\n"


def test_hostile_arguments_and_results_are_shown_escaped(env: Env) -> None:
    hostile = "echo \x1b]0;pwned\x07 \x1b[2J\u202egnp.exe"
    env.configure(*_calls(hostile),
                  {"tool_calls": [{"name": "no\x1b[31mtool", "arguments": {"x": "\x1b[2J"}}]},
                  {"text": "done"})
    seen = env.transcript("--yes", "go")
    assert r"→ run_command echo \x1b]0;pwned\x07 \x1b[2J\u202egnp.exe" in seen
    assert r"→ no\x1b[31mtool" in seen
    for raw in ("\x1b]0;", "\x07", "\x1b[2J", "\u202e", "\x1b[31m"):
        assert raw not in seen  # nothing the model wrote reaches the terminal as a control


def test_a_compaction_is_shown(env: Env) -> None:
    env.configure(*_calls("seq 1 300", "seq 1 300"), {"text": "done"},
                  top=('compaction = "truncate"', "context_window = 1500"))
    seen = env.transcript("--yes", "go")
    assert re.search(r"dsh: compacted the history: \d+ → \d+ tokens \(truncate, threshold\)",
                     seen), seen
    assert env.out.read_text() == "done\n"


def _server_run(env: Env, *replies: Reply, args: tuple[str, ...] = ()) -> tuple[str, Any]:
    with ScriptedServer() as server:
        server.script(*replies)
        env.configure(server=server)
        return env.transcript(*args, "hi"), server


def test_a_retried_request_is_shown_with_its_wait(env: Env) -> None:
    ok = Reply(body=openai_completion("answered"))
    seen, server = _server_run(env, Reply(status=500, body={"error": {
        "message": "boom \x1b[2J"}}), ok)
    assert len(server.received) == 2
    assert "dsh: retrying after HTTP 500 (1/4) in " in seen
    assert env.out.read_text() == "answered\n"

    seen, _ = _server_run(env, Reply(status=429, headers={"retry-after": "0.1"}, body={
        "error": {"message": "slow down"}}), ok)
    assert "dsh: rate limited by openai: waiting 0.1 s (1/4)" in seen

    seen, _ = _server_run(env, Reply(status=500, body="x"), ok, args=("-q",))
    assert "retrying" not in seen.replace("retry 1/4", "")  # -q: the status line only

    # not a terminal: stderr as before; --events has the retry as a live event
    with ScriptedServer() as server:
        server.script(Reply(status=503, body="busy"), ok)
        env.configure(server=server)
        piped = env.piped("--events", "hi")
    assert piped.returncode == 0, piped.stderr
    assert "retrying" not in piped.stderr
    retry = [json.loads(line) for line in piped.stdout.splitlines()
             if '"llm/retry"' in line]
    assert len(retry) == 1
    assert retry[0]["status"] == 503 and retry[0]["attempt"] == 1
    assert retry[0]["retries"] == 4 and retry[0]["provider"] == "openai"
    assert 0 <= retry[0]["wait"] <= 0.2
