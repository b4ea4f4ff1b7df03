"""Issue 25 acceptance: tasks and memory survive a SIGKILL mid-turn and a resume in a new
process, the next request is byte-identical whichever process sends it, and a compaction keeps
them. Real subprocesses, a real loopback HTTP server (tests/servers.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import openai_completion
from tests.servers import reconstruct
from tests.servers import sigkill_when

REPO = Path(__file__).resolve().parent.parent
TASKS = [{"content": "read the code", "status": "completed"},
         {"content": "write the tests", "status": "in_progress"}]


def write_config(tmp: Path, server: ScriptedServer, sessions: Path) -> Path:
    cfg = tmp / f"dsh-{sessions.name}.toml"
    cfg.write_text(
        'autoload = false\nmodel = "oa"\ncompaction = "off"\n'
        f'sessions_dir = "{sessions}"\n'
        f'[models.oa]\nadapter = "openai"\nmodel = "gpt-4o"\nbase_url = "{server.url}/v1"\n'
        'retries = 0\n'
        '[plugins."dsh.tasks"]\nenabled = true\n'
        f'[plugins."dsh.memory"]\nenabled = true\nfile = "{tmp / "MEMORY.md"}"\n')
    return cfg


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "DSH_LOAD_PLUGINS")}
    e.update(OPENAI_API_KEY="sk-test-state-resume", PYTHONPATH=str(REPO))
    return e


def dsh(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsh", "--config", str(cfg), *args],
                          capture_output=True, text=True, env=env(), timeout=120,
                          stdin=subprocess.DEVNULL)


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    with ScriptedServer() as s:
        yield s


def test_tasks_and_memory_survive_sigkill_and_resume_byte_identically(
        tmp_path: Path, server: ScriptedServer) -> None:
    from dsh.config import trust

    (tmp_path / "MEMORY.md").write_text("- the project uses tabs\n")
    # The person trusted the memory file's content (a file dsh did not write is used only then).
    trust.approve(tmp_path, "MEMORY.md", trust.digest(b"- the project uses tabs\n"), "memory")
    sessions = tmp_path / "sessions"
    cfg = write_config(tmp_path, server, sessions)
    server.script(
        Reply(body=openai_completion(calls=[
            ("c1", "update_tasks", json.dumps({"tasks": TASKS})),
            ("c2", "remember", json.dumps({"fact": "the user is called Ada"}))])),
        Reply(body=openai_completion("planned")),
        Reply(body=openai_completion("never seen"), delay=120),  # turn 2: killed while waiting
    )
    first = dsh(cfg, "run", "--json", "plan the work")
    assert first.returncode == 0, first.stderr
    sid = json.loads(first.stdout)["session"]
    # Turn 2 in a second process, SIGKILLed while its request is in flight.
    proc = subprocess.Popen([sys.executable, "-m", "dsh", "--config", str(cfg), "run",
                             "--session", sid, "go on"], env=env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sigkill_when(proc, lambda: len(server.received) == 3, "turn 2 never sent its request")
    killed = server.received[2].body
    system = killed["messages"][0]
    assert system["role"] == "system"
    assert "[x] 1. read the code" in system["content"]
    assert "[~] 2. write the tests" in system["content"]
    assert "- [1] the user is called Ada" in system["content"]
    assert "the project uses tabs" in system["content"]
    # memory (from the file, then the facts) comes before the tasks: system, memory, tasks
    assert system["content"].index("Memory") < system["content"].index("Tasks")

    # The memory file changes after the kill: the resumed turn records the new content.
    ledger = sessions / f"{sid}.jsonl"
    twin = tmp_path / "twin"
    twin.mkdir()
    shutil.copy(ledger, twin / ledger.name)  # the same ledger, resumed by another process
    server.script(Reply(body=openai_completion("resumed")),
                  Reply(body=openai_completion("resumed")))
    again = dsh(cfg, "run", "--session", sid, "go on")
    assert again.returncode == 0, again.stderr
    twin_cfg = write_config(tmp_path, server, twin)
    other = dsh(twin_cfg, "run", "--session", sid, "go on")
    assert other.returncode == 0, other.stderr
    a, b = server.received[3], server.received[4]
    assert a.raw == b.raw  # byte-identical, from two processes resuming the same ledger
    assert a.body["messages"][0] == system  # the same tasks and memory as before the kill
    assert reconstruct(ledger)[-1] == a.body  # and it is what the ledger alone rebuilds (C3)


def test_state_survives_compaction(tmp_path: Path, server: ScriptedServer,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A compaction replaces every message of the history: the tasks and the facts are plugin
    events, not messages, and the next turn in a new process still shows them."""
    from dsh.core.messages import Message
    from dsh.ledger.events import ContextCompacted
    from dsh.run.app import App

    sessions = tmp_path / "sessions"
    cfg = write_config(tmp_path, server, sessions)
    server.script(
        Reply(body=openai_completion(calls=[
            ("c1", "update_tasks", json.dumps({"tasks": TASKS})),
            ("c2", "remember", json.dumps({"fact": "the user is called Ada"}))])),
        Reply(body=openai_completion("ok")),
        Reply(body=openai_completion("after")),
    )
    first = dsh(cfg, "run", "--json", "plan")
    assert first.returncode == 0, first.stderr
    sid = json.loads(first.stdout)["session"]
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-state-resume")
    with App.from_config(cfg).session(None, sid) as s:
        n = len(s.ledger.projection)
        s.ledger.append(ContextCompacted, start=0, end=n, strategy="test", reason="manual",
                        messages=(Message(role="user", content="(summary)"),))
    again = dsh(cfg, "run", "--session", sid, "next")
    assert again.returncode == 0, again.stderr
    body = server.received[-1].body
    assert body["messages"][1] == {"role": "user", "content": "(summary)"}  # compacted
    system = body["messages"][0]["content"]
    assert "[~] 2. write the tests" in system and "- [1] the user is called Ada" in system
    shown = dsh(cfg, "sessions", "show", sid)
    assert shown.returncode == 0, shown.stderr
    assert "[~] 2. write the tests" in shown.stdout
