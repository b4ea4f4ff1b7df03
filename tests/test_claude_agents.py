"""Issue 24 item 4: sub-agent files (``.claude/agents/*.md``) become dsh agents — ``dsh run
-a NAME`` and sub-agents the main agent delegates to (chained budgets), resumable after a
SIGKILL with byte-identical requests. Real subprocesses, a loopback OpenAI-compatible server.
"""

from __future__ import annotations

import json
import shutil
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

REVIEWER = """---
name: reviewer
description: Reviews a change and lists its risks.
tools: Read, Grep, WebFetch
model: inherit
---
You are a careful code reviewer. List risks, most serious first.
"""


def answer(text: str = "ok") -> Reply:
    return Reply(body=openai_completion(text))


def test_agent_file_runs_with_dash_a(project: Project) -> None:
    project.approve(write(project.root / ".claude/agents/reviewer.md", REVIEWER))
    project.server.script(answer("two risks"))
    run = project.dsh("run", "--json", "-a", "reviewer", "review the diff")
    assert run.returncode == 0, run.stderr
    body = project.server.received[0].body
    assert body["messages"][0] == {
        "role": "system",
        "content": "You are a careful code reviewer. List risks, most serious first."}
    assert body["model"] == "gpt-4o"  # inherit, run on its own: the default model
    # mapped (docs/claude.md, "Tool names"); WebFetch: dsh-web is not enabled here
    assert [t["function"]["name"] for t in body.get("tools", [])] == ["read_file", "grep"]
    listing = project.dsh("claude", "agents")
    assert listing.returncode == 0, listing.stderr
    assert "reviewer\tReviews a change and lists its risks." in listing.stdout
    assert "  tools: read_file (Read), grep (Grep)" in listing.stdout
    assert "tool 'WebFetch' (web_fetch) is not available here" in listing.stderr
    inventory = project.dsh("agents")  # dsh's own listing has it too
    assert inventory.returncode == 0, inventory.stderr
    assert "\nreviewer\n" in inventory.stdout and "tools: read_file, grep" in inventory.stdout


def test_main_agent_delegates_and_resume_after_sigkill_is_byte_identical(
        project: Project, tmp_path: Path) -> None:
    project.approve(write(project.root / ".claude/agents/reviewer.md", REVIEWER))
    project.write_config('[agents.default]\nsubagents = ["reviewer"]\n'
                         "[limits]\nrequests = 20\n")
    s = project.server
    s.script(Reply(body=openai_completion(calls=[
                 ("c1", "ask_reviewer", json.dumps({"prompt": "review foo.py"}))])),
             answer("risk: none"),  # the reviewer's answer
             answer("The reviewer says: no risk."),
             Reply(body=openai_completion("never seen"), delay=120))  # turn 2: killed
    first = project.dsh("run", "--json", "check foo.py")
    assert first.returncode == 0, first.stderr
    data = json.loads(first.stdout)
    assert data["output"] == "The reviewer says: no risk."
    main, child, final = (r.body for r in s.received[:3])
    assert "ask_reviewer" in [t["function"]["name"] for t in main["tools"]]
    assert child["messages"][0]["content"].startswith("You are a careful code reviewer.")
    assert last_user_text(child) == "review foo.py"
    assert child["model"] == main["model"] == "gpt-4o"  # inherit: the parent's model
    shown = project.dsh("sessions", "show", data["session"])
    assert shown.returncode == 0, shown.stderr
    assert "agent reviewer" in shown.stdout and "sub-agent of session" in shown.stdout

    proc = project.popen("run", "--session", data["session"], "and bar.py?")
    sigkill_when(proc, lambda: len(s.received) >= 4, "turn 2 never sent its request")
    ledger = project.sessions / f"{data['session']}.jsonl"
    twin = tmp_path / "twin"
    twin.mkdir()
    for path in project.sessions.glob("*.jsonl"):  # the child's session too
        shutil.copy(path, twin / path.name)
    s.script(answer("resumed"), answer("resumed"))
    again = project.dsh("run", "--session", data["session"], "and bar.py?")
    assert again.returncode == 0, again.stderr
    project.sessions, saved = twin, project.sessions
    project.write_config(project.extra)
    other = project.dsh("run", "--session", data["session"], "and bar.py?")
    project.sessions = saved
    assert other.returncode == 0, other.stderr
    a, b = s.received[4], s.received[5]
    assert a.raw == b.raw  # byte-identical from two processes resuming the same ledger
    assert reconstruct(ledger)[-1] == a.body  # and what the ledger alone rebuilds (C3)


def test_config_agent_wins_a_collision_with_a_note(project: Project) -> None:
    write(project.root / ".claude/agents/reviewer.md", REVIEWER)
    project.write_config('[agents.reviewer]\nsystem = "From the config."\n')
    project.server.script(answer())
    run = project.dsh("run", "-a", "reviewer", "hi")
    assert run.returncode == 0, run.stderr
    assert project.server.received[0].body["messages"][0]["content"] == "From the config."
    assert "agent 'reviewer' from " in run.stderr and "reviewer.md ignored" in run.stderr


@pytest.mark.parametrize(("text", "problem"), [
    ("---\ndescription: no name\n---\nBody", "key 'name'"),
    ("---\nname: Bad Name\ndescription: d\n---\nBody", "key 'name'"),
    ("---\nname: x\n---\nBody", "key 'description': required"),
    ("---\nname: x\ndescription: &a d\n---\nBody", "anchors and aliases are not allowed"),
    ("---\nname: x\ndescription: d\ntools: [[[[[[[[[[[[[[[[[[[[x]]]]]]]]]]]]]]]]]]]\n---\n",
     "nesting deeper"),
])
def test_bad_agent_files_are_skipped_with_one_line_and_the_rest_loads(
        project: Project, text: str, problem: str) -> None:
    write(project.root / ".claude/agents/bad.md", text)
    project.approve(write(project.root / ".claude/agents/reviewer.md", REVIEWER))
    project.server.script(answer())
    run = project.dsh("run", "-a", "reviewer", "hi")
    assert run.returncode == 0, run.stderr
    notes = [line for line in run.stderr.splitlines() if "bad.md" in line]
    assert len(notes) == 1 and problem in notes[0] and "agent file skipped" in notes[0], \
        run.stderr
    bad = project.dsh("run", "-a", "x", "hi")
    assert bad.returncode == 2 and "unknown agent 'x'" in bad.stderr


def test_model_names_map_as_documented() -> None:
    from dsh_claude.agents import map_model

    assert map_model("sonnet", {}) == "anthropic:claude-sonnet-4-5"
    assert map_model("opus", {}) == "anthropic:claude-opus-4-1"
    assert map_model("haiku", {}) == "anthropic:claude-haiku-4-5"
    assert map_model("inherit", {}) == "inherit"
    assert map_model("claude-3-5-haiku-20241022", {}) == "anthropic:claude-3-5-haiku-20241022"
    assert map_model("sonnet", {"models": {"sonnet": "oa"}}) == "oa"
    assert map_model("openai:gpt-4o", {}) == "openai:gpt-4o"
