"""Issue 24's "Done when", as one scenario: a project folder with AGENTS.md, CLAUDE.md (+ an
``@import``), two skills (one with a resource file), two commands, one sub-agent file and one
Claude Code plugin folder (a PreToolUse hook found through ``${CLAUDE_PLUGIN_ROOT}``, a command,
a skill and a ``.mcp.json`` naming the real stdio server ``mcp-server-time``), enabled with
``dsh claude add``. Under ``dsh run`` with a scripted loopback model: the first request holds
the instructions and the catalogue of all three skills and offers the MCP server's tools; the
model loads a skill and reads its resource; ``/NAME ARGS`` expands (the expansion is the
recorded user message); the main agent delegates to the sub-agent; the plugin's hook blocks a
``run_command`` (it does not run); ``dsh sessions show`` shows it all. Then ``dsh chat`` with
``/NAME``, and a resume after SIGKILL sends the bytes the killed process sent.

Real ``dsh`` subprocesses, real hook and MCP server processes; nothing leaves the machine."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.claude_fixtures import Project
from tests.claude_fixtures import last_user_text
from tests.claude_fixtures import project as project  # noqa: F401 (fixture)
from tests.claude_fixtures import server as server  # noqa: F401 (fixture)
from tests.claude_fixtures import write
from tests.servers import Reply
from tests.servers import openai_completion
from tests.servers import reconstruct
from tests.servers import sigkill_when

pytest.importorskip("dsh_hooks", reason="pip install ./plugins/dsh-hooks")
pytest.importorskip("dsh_mcp", reason="pip install ./plugins/dsh-mcp")
pytest.importorskip("dsh_shell", reason="pip install ./plugins/dsh-shell")

TIME_SERVER = Path(sys.executable).parent / "mcp-server-time"

GUARD = """\
#!/bin/bash
INPUT=$(cat)
if printf '%s' "$INPUT" | grep -q 'rm -rf'; then
  echo "GUARD: rm -rf is not allowed here" >&2
  exit 2
fi
"""


def make_plugin(folder: Path) -> Path:
    write(folder / ".claude-plugin/plugin.json", json.dumps(
        {"name": "guard", "version": "0.3.0", "description": "Guards the shell"}))
    write(folder / "hooks/hooks.json", json.dumps({"hooks": {"PreToolUse": [{
        "matcher": "Bash",
        "hooks": [{"type": "command", "command": "${CLAUDE_PLUGIN_ROOT}/scripts/guard.sh"}]}]}}))
    write(folder / "scripts/guard.sh", GUARD).chmod(0o755)
    write(folder / "commands/lint.md", "---\ndescription: Lint a file\n---\nLINT-CMD: lint $1.")
    write(folder / "skills/style/SKILL.md",
          "---\nname: style\ndescription: The guard plugin's house style.\n---\nUse tabs.")
    write(folder / ".mcp.json", json.dumps({"mcpServers": {"time": {
        "command": str(TIME_SERVER), "args": ["--local-timezone", "UTC"]}}}))
    return folder


def make_project(root: Path) -> None:
    write(root / "AGENTS.md", "AGENTS-RULE: indent with four spaces.\n")
    write(root / "CLAUDE.md", "CLAUDE-RULE: see @docs/style.md for the style.\n")
    write(root / "docs/style.md", "IMPORTED-RULE: lines under 100 characters.\n")
    write(root / ".claude/skills/release-notes/SKILL.md",
          "---\nname: release-notes\ndescription: Write release notes from the git log.\n---\n"
          "SKILL-BODY: read template.md with skill_file, then fill it in.\n")
    write(root / ".claude/skills/release-notes/template.md", "TEMPLATE: ## Version X\n")
    write(root / ".claude/skills/unit-tests/SKILL.md",
          "---\nname: unit-tests\ndescription: How this project writes unit tests.\n---\n"
          "Write tests with pytest.\n")
    write(root / ".claude/commands/review.md",
          "---\ndescription: Review a file\nargument-hint: FILE\n---\n"
          "REVIEW-CMD: review $1 for risks ($ARGUMENTS).\n")
    write(root / ".claude/commands/greet.md", "Hello $1!")
    write(root / ".claude/agents/reviewer.md",
          "---\nname: reviewer\ndescription: Reviews a change and lists its risks.\n"
          "tools: Read\nmodel: inherit\n---\nYou are a careful code reviewer.\n")
    (root / "victim").mkdir()


def call(cid: str, tool: str, **arguments: str) -> Reply:
    return Reply(body=openai_completion(calls=[(cid, tool, json.dumps(arguments))]))


def answer(text: str) -> Reply:
    return Reply(body=openai_completion(text))


def tool_results(body: dict) -> dict[str, str]:  # type: ignore[type-arg]
    return {m["tool_call_id"]: m["content"] for m in body["messages"] if m["role"] == "tool"}


def test_done_when_scenario(project: Project, tmp_path: Path) -> None:
    assert TIME_SERVER.exists(), "mcp-server-time is not installed in this venv"
    root = project.root
    make_project(root)
    plugin = make_plugin(tmp_path / "guard-plugin")
    project.write_config(
        '[agents.default]\nsubagents = ["reviewer"]\n[limits]\nrequests = 30\n'
        f'[plugins.shell]\nworkspace = "{root}"\ntty = "{tmp_path / "no-tty"}"\n')
    added = project.dsh("claude", "add", str(plugin))
    assert added.returncode == 0, added.stderr
    assert added.stdout == f"guard 0.3.0: {plugin.resolve()}\n"
    project.approve(root / ".claude/agents/reviewer.md")  # a project agent file: trusted first

    s = project.server
    s.script(call("c1", "skill", name="release-notes"),
             call("c2", "skill_file", name="release-notes", path="template.md"),
             call("c3", "ask_reviewer", prompt="review foo.py"),
             answer("risk: none"),  # the reviewer's own request
             call("c4", "run_command", command="rm -rf victim; touch ran.marker"),
             call("c5", "mcp__time__get_current_time", timezone="UTC"),
             answer("reviewed: no risk"))
    first = project.dsh("run", "--yes", "--json", "/review foo.py quickly")
    assert first.returncode == 0, first.stderr
    data = json.loads(first.stdout)
    sid = data["session"]
    assert data["output"] == "reviewed: no risk"
    assert len(s.received) == 7

    # The first request: the instructions (both files and the import), the catalogue of all
    # three skills (the plugin's too), and the tools: skills, sub-agent, shell, MCP.
    req0 = s.received[0].body
    system = req0["messages"][0]["content"]
    at = [system.index(m) for m in ("AGENTS-RULE", "CLAUDE-RULE", "IMPORTED-RULE")]
    assert at == sorted(at), system
    assert "docs/style.md (imported by CLAUDE.md)" in system
    for line in ("- release-notes: Write release notes from the git log.",
                 "- unit-tests: How this project writes unit tests.",
                 "- style: The guard plugin's house style."):
        assert line in system, system
    assert "SKILL-BODY" not in system and "Use tabs." not in system  # only the catalogue
    tools = {t["function"]["name"] for t in req0["tools"]}
    assert {"skill", "skill_file", "ask_reviewer", "run_command",
            "mcp__time__get_current_time", "mcp__time__convert_time"} <= tools, tools
    expansion = "REVIEW-CMD: review foo.py for risks (foo.py quickly)."
    assert last_user_text(req0) == expansion
    assert project.user_messages(sid) == [expansion]

    # The skill's body, then its resource file.
    results = tool_results(s.received[6].body)
    assert "SKILL-BODY" in results["c1"] and "template.md" in results["c1"]
    assert results["c2"] == "TEMPLATE: ## Version X\n"
    # Delegation: the child request is the sub-agent file's, its answer comes back.
    child = s.received[3].body
    assert child["messages"][0]["content"].startswith("You are a careful code reviewer.")
    assert last_user_text(child) == "review foo.py"
    assert [t["function"]["name"] for t in child.get("tools", [])] == ["read_file"]
    assert "risk: none" in results["c3"]
    # The plugin's hook blocked the command: it did not run.
    assert "GUARD: rm -rf is not allowed here" in results["c4"], results["c4"]
    assert (root / "victim").is_dir() and not (root / "ran.marker").exists()
    # The MCP server answered.
    assert '"timezone": "UTC"' in results["c5"], results["c5"]

    shown = project.dsh("sessions", "show", sid)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "instructions: AGENTS.md sha256:" in out, out
    assert "CLAUDE.md sha256:" in out and "docs/style.md via CLAUDE.md sha256:" in out
    assert "loaded skill release-notes" in out
    assert "GUARD: rm -rf is not allowed here" in out
    assert "agent reviewer" in out and "sub-agent of session" in out

    # dsh chat: /NAME expands there too (a plugin command, by its alias).
    before = set(project.sessions.glob("*.jsonl"))
    s.script(answer("linted"))
    chat = project.dsh("chat", input="/lint main.py\n")
    assert chat.returncode == 0, chat.stderr
    assert "linted" in chat.stdout
    [new] = [p for p in set(project.sessions.glob("*.jsonl")) - before]
    assert project.user_messages(new.stem) == ["LINT-CMD: lint main.py."]
    assert last_user_text(s.received[7].body) == "LINT-CMD: lint main.py."
    chat_system = s.received[7].body["messages"][0]["content"]
    assert "AGENTS-RULE" in chat_system and "- style:" in chat_system

    # Resume after SIGKILL: turn 2 is killed while its request is in flight; a new process
    # resumes: the same bytes plus its prompt, as a second process from a copy of the ledger.
    s.script(Reply(body=openai_completion("never seen"), delay=120))
    proc = project.popen("run", "--yes", "--session", sid, "/greet Ada")
    sigkill_when(proc, lambda: len(s.received) >= 9, "turn 2 never sent its request")
    killed = s.received[8]
    assert last_user_text(killed.body) == "Hello Ada!"
    twin = tmp_path / "twin"
    twin.mkdir()
    for path in project.sessions.glob("*.jsonl"):
        shutil.copy(path, twin / path.name)
    s.script(answer("resumed"), answer("resumed"))
    again = project.dsh("run", "--yes", "--session", sid, "/greet Ada")
    assert again.returncode == 0, again.stderr
    text = project.config.read_text()
    assert text.count(f'"{project.sessions}"') == 1
    project.config.write_text(text.replace(f'"{project.sessions}"', f'"{twin}"'))
    other = project.dsh("run", "--yes", "--session", sid, "/greet Ada")
    assert other.returncode == 0, other.stderr
    a, b = s.received[9], s.received[10]
    # `dsh run --session ID PROMPT` always adds PROMPT as a new user message (the killed
    # turn's message stays in the history, as recorded), so the resumed request is the killed
    # one, byte for byte, with that one message more.
    more = {"role": "user", "content": "Hello Ada!"}
    assert a.body["messages"] == [*killed.body["messages"], more]
    tail = b', {"role": "user", "content": "Hello Ada!"}]'
    assert killed.raw.count(tail[2:]) == 1, killed.raw  # the messages' end, once
    assert a.raw == killed.raw.replace(tail[2:], tail[2:-1] + tail)
    assert b.raw == a.raw
    assert reconstruct(project.sessions / f"{sid}.jsonl")[-1] == a.body
