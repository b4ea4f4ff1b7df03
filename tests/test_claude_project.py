"""Issue 24 items 1 and 2 (dsh-claude): a project with AGENTS.md (root + subfolder),
CLAUDE.md with an import, a user CLAUDE.md and two skills (one with a resource file) under
`dsh run` in real subprocesses against a loopback OpenAI-compatible server: the request holds
the instructions and the catalogue, the model loads a skill and reads its resource, a tool the
active skill's allowed-tools leaves out is refused, `dsh sessions show` says which files shaped
the turn, and a resume after SIGKILL sends byte-identical requests."""

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

pytest.importorskip("dsh_claude", reason="pip install ./plugins/dsh-claude")

REPO = Path(__file__).resolve().parent.parent

SKILL_A = """---
name: release-notes
description: Write release notes from the git log. Use when asked for release notes.
allowed-tools: Read skill_file
metadata:
  author: the dsh tests
---
# Release notes

Read template.md with skill_file, then fill it in.
"""

SKILL_B = """---
name: unit-tests
description: >
  How this project writes unit tests.
license: Apache-2.0
---
Write tests with pytest; one file per module.
"""


def make_project(tmp: Path) -> tuple[Path, Path]:
    """(project root, its subfolder the run starts in); HOME is tmp/home."""
    home = tmp / "home"
    (home / ".claude").mkdir(parents=True)
    (home / ".claude" / "CLAUDE.md").write_text("USER-CLAUDE: answer briefly.\n")
    root = tmp / "proj"
    sub = root / "pkg"
    (root / ".git").mkdir(parents=True)
    sub.mkdir()
    (root / "AGENTS.md").write_text("ROOT-AGENTS: indent with four spaces.\n")
    (sub / "AGENTS.md").write_text("SUB-AGENTS: this package is pure Python.\n")
    (root / "docs").mkdir()
    (root / "docs" / "style.md").write_text("IMPORTED-STYLE: lines under 100 characters.\n")
    (root / "CLAUDE.md").write_text(
        "PROJECT-CLAUDE: see @docs/style.md for the style.\n"
        "Mail bob@example.com; `@not/an/import` is code.\n")
    skills = root / ".claude" / "skills"
    (skills / "release-notes").mkdir(parents=True)
    (skills / "release-notes" / "SKILL.md").write_text(SKILL_A)
    (skills / "release-notes" / "template.md").write_text("TEMPLATE: ## Version X\n")
    (skills / "unit-tests").mkdir()
    (skills / "unit-tests" / "SKILL.md").write_text(SKILL_B)
    (skills / "broken").mkdir()  # skipped with a warning; the rest still loads
    (skills / "broken" / "SKILL.md").write_text("---\nname: broken\ndescription: &d x\n---\n")
    return root, sub


def write_config(tmp: Path, server: ScriptedServer, sessions: Path) -> Path:
    cfg = tmp / f"dsh-{sessions.name}.toml"
    cfg.write_text(
        'model = "oa"\ncompaction = "off"\n'
        f'sessions_dir = "{sessions}"\n'
        f'[models.oa]\nadapter = "openai"\nmodel = "gpt-4o"\nbase_url = "{server.url}/v1"\n'
        'retries = 0\n'
        '[plugins."dsh.tasks"]\nenabled = true\n')
    return cfg


def env(tmp: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items()
         if k not in ("NO_COLOR", "DSH_LOAD_PLUGINS", "CLAUDE_CONFIG_DIR", "CODEX_HOME")}
    # dsh's data folder apart from HOME: it is a protected path, which dsh never reads
    # for a project (a user CLAUDE.md under it would be refused).
    e.update(OPENAI_API_KEY="sk-test-claude", PYTHONPATH=str(REPO), HOME=str(tmp / "home"),
             DSH_LOAD_PLUGINS="claude", DSH_HOME=str(tmp / "dsh-home"))
    return e


def dsh(tmp: Path, cwd: Path, cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsh", "--config", str(cfg), *args],
                          capture_output=True, text=True, env=env(tmp), timeout=120,
                          stdin=subprocess.DEVNULL, cwd=cwd)


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    with ScriptedServer() as s:
        yield s


def tool_results(body: dict) -> dict[str, str]:  # type: ignore[type-arg]
    return {m["tool_call_id"]: m["content"] for m in body["messages"] if m["role"] == "tool"}


def test_project_instructions_skills_refusal_and_resume(tmp_path: Path,
                                                        server: ScriptedServer) -> None:
    root, sub = make_project(tmp_path)
    sessions = tmp_path / "sessions"
    cfg = write_config(tmp_path, server, sessions)
    tasks = json.dumps({"tasks": [{"content": "x", "status": "pending"}]})
    server.script(
        Reply(body=openai_completion(calls=[("c1", "skill",
                                             json.dumps({"name": "release-notes"}))])),
        Reply(body=openai_completion(calls=[
            ("c2", "update_tasks", tasks),
            ("c3", "skill_file", json.dumps({"name": "release-notes",
                                             "path": "template.md"})),
            ("c4", "skill_file", json.dumps({"name": "release-notes",
                                             "path": "../unit-tests/SKILL.md"}))])),
        Reply(body=openai_completion("notes written")),
    )
    first = dsh(tmp_path, sub, cfg, "run", "--json", "write the release notes")
    assert first.returncode == 0, first.stderr
    sid = json.loads(first.stdout)["session"]
    warning = f"dsh-claude: {root}/.claude/skills/broken/SKILL.md: line 3: the frontmatter has "
    assert warning + "an anchor (&d)" in first.stderr, first.stderr
    system = server.received[0].body["messages"][0]["content"]
    assert "broken" not in system
    order = ["USER-CLAUDE", "ROOT-AGENTS", "PROJECT-CLAUDE", "IMPORTED-STYLE", "SUB-AGENTS"]
    at = [system.index(marker) for marker in order]
    assert at == sorted(at), system  # user first, then root down to the folder, nearest last
    assert "## docs/style.md (imported by CLAUDE.md)" in system
    assert "not/an/import" not in system.replace("`@not/an/import`", "")
    assert "- release-notes: Write release notes from the git log." in system
    assert "- unit-tests: How this project writes unit tests." in system
    assert "Write tests with pytest" not in system  # only the catalogue, not the bodies
    tools = {t["function"]["name"] for t in server.received[0].body["tools"]}
    assert {"skill", "skill_file", "update_tasks"} <= tools

    results = tool_results(server.received[2].body)
    assert "Read template.md with skill_file" in results["c1"]
    assert "template.md" in results["c1"]  # the files are listed
    assert "tool call blocked by claude" in results["c2"]
    assert "allowed-tools" in results["c2"] and "update_tasks" in results["c2"]
    assert results["c3"] == "TEMPLATE: ## Version X\n"
    assert "without '..'" in results["c4"] and "pytest" not in results["c4"]

    shown = dsh(tmp_path, sub, cfg, "sessions", "show", sid)
    assert shown.returncode == 0, shown.stderr
    assert "instructions: ~/.claude/CLAUDE.md sha256:" in shown.stdout
    assert "pkg/AGENTS.md sha256:" in shown.stdout
    assert "docs/style.md via CLAUDE.md sha256:" in shown.stdout
    assert "loaded skill release-notes" in shown.stdout

    # Turn 2: the next turn, in a new process, lets update_tasks run again (the skill was
    # active until the end of turn 1) — SIGKILLed while its request is in flight.
    server.script(Reply(body=openai_completion("never seen"), delay=120))
    proc = subprocess.Popen([sys.executable, "-m", "dsh", "--config", str(cfg), "run",
                             "--session", sid, "go on"], env=env(tmp_path), cwd=sub,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    sigkill_when(proc, lambda: len(server.received) >= 4, "turn 2 never sent its request")
    killed = server.received[3].body
    assert killed["messages"][0]["content"] == system

    # A file changes after the kill; two processes resume copies of the same ledger.
    ledger = sessions / f"{sid}.jsonl"
    twin = tmp_path / "twin"
    twin.mkdir()
    shutil.copy(ledger, twin / ledger.name)
    (sub / "AGENTS.md").write_text("SUB-AGENTS-CHANGED: now with C extensions.\n")
    server.script(Reply(body=openai_completion("resumed")),
                  Reply(body=openai_completion("resumed")))
    again = dsh(tmp_path, sub, cfg, "run", "--session", sid, "go on")
    assert again.returncode == 0, again.stderr
    other = dsh(tmp_path, sub, write_config(tmp_path, server, twin), "run", "--session", sid,
                "go on")
    assert other.returncode == 0, other.stderr
    a, b = server.received[4], server.received[5]
    assert a.raw == b.raw  # byte-identical from two processes
    assert reconstruct(ledger)[-1] == a.body  # what the ledger alone rebuilds (C3)
    new_system = a.body["messages"][0]["content"]
    assert "SUB-AGENTS-CHANGED" in new_system and "SUB-AGENTS:" not in new_system
    # turn 1's requests are rebuilt from the ledger with the files as they were then
    assert reconstruct(ledger)[:3] == [r.body for r in server.received[:3]]


def test_project_without_files_is_unchanged(tmp_path: Path, server: ScriptedServer) -> None:
    """No AGENTS.md, CLAUDE.md or skills: the request is what it is without the plugin, and
    no event of the plugin is recorded."""
    (tmp_path / "home").mkdir()
    bare = tmp_path / "bare"
    bare.mkdir()
    sessions = tmp_path / "sessions"
    cfg = write_config(tmp_path, server, sessions)
    server.script(Reply(body=openai_completion("hi")), Reply(body=openai_completion("hi")))
    with_plugin = dsh(tmp_path, bare, cfg, "run", "hello")
    assert with_plugin.returncode == 0, with_plugin.stderr
    e = env(tmp_path)
    e["DSH_LOAD_PLUGINS"] = ""
    without = subprocess.run([sys.executable, "-m", "dsh", "--config", str(cfg), "run",
                              "hello"], capture_output=True, text=True, env=e, timeout=120,
                             stdin=subprocess.DEVNULL, cwd=bare)
    assert without.returncode == 0, without.stderr
    assert server.received[0].raw == server.received[1].raw
    for ledger in sessions.glob("*.jsonl"):
        assert "x/claude/" not in ledger.read_text()


def test_nothing_of_the_plugin_is_imported_unless_enabled(tmp_path: Path,
                                                         server: ScriptedServer) -> None:
    """An agent whose plugins leave out `claude`, in a project full of these files: only the
    entry point module is imported (it is only hook implementations), not its readers nor
    PyYAML, and the request carries nothing of the files."""
    root, sub = make_project(tmp_path)
    cfg = write_config(tmp_path, server, tmp_path / "sessions")
    cfg.write_text(cfg.read_text() + '[agents.plain]\nplugins = []\n')
    server.script(Reply(body=openai_completion("hi")))
    e = env(tmp_path)
    probe = ("import sys, runpy; sys.argv = ['dsh', '--config', sys.argv[1], 'run', '-a', "
             "'plain', 'hello']\ntry:\n    runpy.run_module('dsh', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.startswith(('dsh_claude', 'yaml'))), "
             "file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe, str(cfg)], capture_output=True,
                          text=True, env=e, timeout=120, stdin=subprocess.DEVNULL, cwd=sub)
    assert done.stdout.strip() == "hi", done.stderr
    assert done.stderr.strip().splitlines()[-1] == "['dsh_claude']", done.stderr
    system = server.received[0].body["messages"][0].get("content", "")
    assert "AGENTS" not in system and "Skills" not in system


def test_piped_chat_sees_the_same_instructions_and_skills(tmp_path: Path,
                                                          server: ScriptedServer) -> None:
    """`dsh chat` (piped: one message per line) builds its turns the same way: each turn's
    system prompt holds the instructions and the catalogue, and the model loads a skill."""
    root, sub = make_project(tmp_path)
    cfg = write_config(tmp_path, server, tmp_path / "sessions")
    server.script(
        Reply(body=openai_completion(calls=[("c1", "skill", json.dumps({"name": "unit-tests"}))])),
        Reply(body=openai_completion("first done")),
        Reply(body=openai_completion("second done")))
    done = subprocess.run([sys.executable, "-m", "dsh", "--config", str(cfg), "chat"],
                          input="how do we test?\nand then?\n", capture_output=True, text=True,
                          env=env(tmp_path), timeout=120, cwd=sub)
    assert done.returncode == 0, done.stderr
    assert "first done" in done.stdout and "second done" in done.stdout
    first, last = server.received[0].body, server.received[2].body
    for body in (first, last):
        system = body["messages"][0]["content"]
        assert "ROOT-AGENTS" in system and "SUB-AGENTS" in system
        assert "- unit-tests: How this project writes unit tests." in system
    assert "Write tests with pytest" in tool_results(server.received[1].body)["c1"]


def test_user_folders_follow_claude_config_dir_and_codex_home(tmp_path: Path,
                                                              monkeypatch) -> None:
    """``~/.claude`` and ``~/.codex`` are where Claude Code and Codex look:
    ``$CLAUDE_CONFIG_DIR`` and ``$CODEX_HOME`` when set, else under HOME."""
    from dsh_claude.settings import expand

    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    monkeypatch.delenv("CLAUDE_CONFIG_DIR")
    monkeypatch.delenv("CODEX_HOME")
    assert expand("~/.claude/CLAUDE.md") == tmp_path / "h" / ".claude" / "CLAUDE.md"
    assert expand("~/.codex/AGENTS.md") == tmp_path / "h" / ".codex" / "AGENTS.md"
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "cc"))
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "cx"))
    assert expand("~/.claude/CLAUDE.md") == tmp_path / "cc" / "CLAUDE.md"
    assert expand("~/.claude") == tmp_path / "cc"
    assert expand("~/.codex/AGENTS.md") == tmp_path / "cx" / "AGENTS.md"
    assert expand("~/.claudex/x") == tmp_path / "h" / ".claudex" / "x"  # only the folder itself


def test_an_enabled_plugin_in_a_folder_without_files_imports_only_its_entry_module(
        tmp_path: Path, server: ScriptedServer) -> None:
    """Start-up where nothing is to be read (issue 24): the plugin is enabled, but no
    AGENTS.md, CLAUDE.md or .claude exists from the root down nor in the user's folders — a
    check with ``os.path`` alone answers, and neither its readers, its settings, PyYAML nor
    the prompt-command module is imported."""
    (tmp_path / "home").mkdir()
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / ".git").mkdir()  # the project root: nothing above it is looked at
    cfg = write_config(tmp_path, server, tmp_path / "sessions")
    server.script(Reply(body=openai_completion("hi")))
    probe = ("import sys, runpy; sys.argv = ['dsh', '--config', sys.argv[1], 'run', "
             "'hello']\ntry:\n    runpy.run_module('dsh', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.startswith(('dsh_claude', 'yaml', "
             "'dsh.run.commands'))), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe, str(cfg)], capture_output=True,
                          text=True, env=env(tmp_path), timeout=120,
                          stdin=subprocess.DEVNULL, cwd=bare)
    assert done.stdout.strip() == "hi", done.stderr
    assert done.stderr.strip().splitlines()[-1] == "['dsh_claude']", done.stderr
    (bare / "CLAUDE.md").write_text("Be brief.\n")  # one file: the readers are needed again
    server.script(Reply(body=openai_completion("hi")))
    again = subprocess.run([sys.executable, "-c", probe, str(cfg)], capture_output=True,
                           text=True, env=env(tmp_path), timeout=120,
                           stdin=subprocess.DEVNULL, cwd=bare)
    assert "dsh_claude.instructions" in again.stderr.strip().splitlines()[-1], again.stderr
    assert "Be brief." in server.received[1].body["messages"][0]["content"]
