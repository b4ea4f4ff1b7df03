"""Claude Code's tool names map to dsh's tools (docs/claude.md, "Tool names"): in sub-agent
files' ``tools``, skills' and commands' ``allowed-tools``; ``dsh claude agents`` shows what
each name became and which have no dsh tool. Real subprocesses where an agent is assembled,
a loopback OpenAI-compatible server where a model is asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.claude_fixtures import Project
from tests.claude_fixtures import last_user_text
from tests.claude_fixtures import project as project  # noqa: F401 (fixture)
from tests.claude_fixtures import server as server  # noqa: F401 (fixture)
from tests.claude_fixtures import write
from tests.servers import Reply
from tests.servers import openai_completion

pytest.importorskip("dsh_shell", reason="the workbench tools are dsh-shell's")

#: Every Claude Code tool name and the dsh tool it means (None: none).
EXPECTED = {
    "Read": "read_file", "NotebookRead": "read_file", "Write": "write_file",
    "Edit": "edit_file", "MultiEdit": "multi_edit", "NotebookEdit": "edit_file",
    "Bash": "run_command", "BashOutput": "job_output", "KillShell": "job_kill",
    "KillBash": "job_kill", "Grep": "grep", "Glob": "glob", "LS": "list_dir",
    "WebFetch": "web_fetch", "TodoWrite": "update_tasks", "AskUserQuestion": "ask_user",
    "WebSearch": None, "Task": None, "SlashCommand": None, "ExitPlanMode": None,
    "Skill": None,
}


def agent_file(tools: str, name: str = "reviewer") -> str:
    return (f"---\nname: {name}\ndescription: Reviews a change.\ntools: {tools}\n---\n"
            "You review changes.\n")


def tool_names(project: Project, agent: str = "reviewer") -> list[str]:
    listed = project.dsh("tools", "-a", agent, "--json")
    assert listed.returncode == 0, listed.stderr
    return [t["name"] for t in json.loads(listed.stdout)]


def test_every_claude_name_maps_in_one_table() -> None:
    from dsh_claude.agents import NO_TOOL
    from dsh_claude.agents import PROVIDERS
    from dsh_claude.agents import TOOLS
    from dsh_claude.skills import parse_allowed_tools

    for claude, dsh in EXPECTED.items():
        if dsh is None:
            assert claude not in TOOLS and NO_TOOL[claude], claude
        else:
            assert TOOLS[claude] == dsh, claude
            assert dsh in PROVIDERS, dsh  # where it comes from, for "not available here"
    assert set(TOOLS) | set(NO_TOOL) == set(EXPECTED)
    # Skills' allowed-tools read the same table; a pattern narrows to the tool.
    assert parse_allowed_tools("Read, Edit MultiEdit Bash(git diff:*) Grep Glob LS "
                               "TodoWrite AskUserQuestion WebFetch mcp__x__y", "SKILL.md") == [
        "read_file", "edit_file", "multi_edit", "run_command", "grep", "glob", "list_dir",
        "update_tasks", "ask_user", "web_fetch", "mcp__x__y"]


def test_map_names_says_what_each_name_became(tmp_path: Path) -> None:
    from dsh_claude.agents import map_names
    from dsh_claude.agents import map_tools

    def why_not(tool: str) -> str:
        return "install dsh-web" if tool == "web_fetch" else ""

    path = tmp_path / "a.md"
    names = map_names("Read, Bash(git diff:*), Bash(git log:*), WebFetch, WebSearch, "
                      "read_file, Nonsense", path, {}, why_not)
    assert names is not None
    assert [(n.given, n.wanted, n.tool, n.why) for n in names] == [
        ("Read", "read_file", "read_file", ""),
        ("Bash(git diff:*)", "run_command", "run_command", "its pattern is not enforced"),
        ("Bash(git log:*)", "run_command", "run_command", "its pattern is not enforced"),
        ("WebFetch", "web_fetch", None, "install dsh-web"),
        ("WebSearch", None, None, "dsh has no web search tool"),
        ("read_file", "read_file", "read_file", ""),
        ("Nonsense", None, None, "no dsh tool of that name")]
    notes: list[str] = []
    assert map_tools("Read, Bash(git diff:*), WebFetch, WebSearch", path, {}, notes,
                     why_not) == ["read_file", "run_command"]
    assert notes == [
        f"{path}: tool 'WebFetch' (web_fetch) is not available here (install dsh-web): left out",
        f"{path}: tool 'WebSearch' has no dsh equivalent (dsh has no web search tool): left out"]
    # [plugins.claude] tools changes an entry; no tools key: every tool.
    assert map_tools("Grep", path, {"tools": {"Grep": "mcp__s__grep"}}, [], why_not) == [
        "mcp__s__grep"]
    assert map_tools(None, path, {}, [], why_not) is None


def test_an_agent_file_gets_exactly_the_dsh_tools_it_names(project: Project) -> None:
    project.approve(write(project.root / ".claude/agents/reviewer.md",
                          agent_file("Read, Edit, Grep, Glob, Bash")))
    assert sorted(tool_names(project)) == sorted(
        ["read_file", "edit_file", "grep", "glob", "run_command"])
    project.server.script(Reply(body=openai_completion("looks fine")))
    run = project.dsh("run", "--json", "-a", "reviewer", "review it")
    assert run.returncode == 0, run.stderr
    sent = [t["function"]["name"] for t in project.server.received[0].body["tools"]]
    assert sorted(sent) == sorted(["read_file", "edit_file", "grep", "glob", "run_command"])
    assert "has no dsh equivalent" not in run.stderr


def test_dsh_claude_agents_lists_every_tool_and_the_names_left_out(project: Project) -> None:
    project.write_config('[plugins."dsh.tasks"]\nenabled = true\n')  # update_tasks is there
    project.approve(write(project.root / ".claude/agents/reviewer.md", agent_file(
        "Read, Write, Edit, MultiEdit, NotebookEdit, Bash(git diff:*), BashOutput, KillShell, "
        "Grep, Glob, LS, AskUserQuestion, TodoWrite, WebSearch, Task, WebFetch")))
    listing = project.dsh("claude", "agents")
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0].startswith("reviewer\tReviews a change.\t")
    assert lines[1] == (
        "  tools: read_file (Read), write_file (Write), edit_file (Edit), "
        "multi_edit (MultiEdit), edit_file (NotebookEdit), "
        "run_command (Bash(git diff:*): its pattern is not enforced), "
        "job_output (BashOutput), job_kill (KillShell), grep (Grep), glob (Glob), "
        "list_dir (LS), ask_user (AskUserQuestion), update_tasks (TodoWrite)")
    assert lines[2].startswith("  no dsh tool: WebSearch (dsh has no web search tool), "
                               "Task (delegation is named in the config")
    # dsh-web is off unless enabled: WebFetch is said to be unavailable, and why.
    assert lines[3] == ("  not available here: WebFetch → web_fetch (install dsh-web and set "
                        "[plugins.web] enabled = true)")
    assert "tool 'WebSearch' has no dsh equivalent" in listing.stderr
    # The agent assembles with every tool it got (none it lacks fails it).
    assert sorted(tool_names(project)) == sorted(
        ["read_file", "write_file", "edit_file", "multi_edit", "run_command", "job_output",
         "job_kill", "grep", "glob", "list_dir", "ask_user", "update_tasks"])
    inventory = project.dsh("agents")
    assert inventory.returncode == 0, inventory.stderr


def test_a_tool_whose_plugin_is_off_is_left_out_and_the_agent_still_runs(
        project: Project) -> None:
    project.approve(write(project.root / ".claude/agents/reviewer.md",
                          agent_file("Read, TodoWrite, WebFetch, web_fetch")))
    assert tool_names(project) == ["read_file"]  # dsh.tasks and dsh-web are off
    listing = project.dsh("claude", "agents")
    assert ("  not available here: TodoWrite → update_tasks (set [plugins.\"dsh.tasks\"] "
            "enabled = true), WebFetch → web_fetch (install dsh-web and set [plugins.web] "
            "enabled = true), web_fetch (install dsh-web and set [plugins.web] enabled = "
            "true)") in listing.stdout.splitlines()
    # Not said at every run: it is how the file maps, not a problem.
    run = project.dsh("tools", "-a", "reviewer")
    assert "not available here" not in run.stderr


def test_web_fetch_maps_to_dsh_web_when_it_is_enabled(project: Project) -> None:
    pytest.importorskip("dsh_web", reason="dsh-web is not installed")
    project.write_config("[plugins.web]\nenabled = true\n")
    project.approve(write(project.root / ".claude/agents/reviewer.md",
                          agent_file("Read, WebFetch")))
    assert sorted(tool_names(project)) == ["read_file", "web_fetch"]
    listing = project.dsh("claude", "agents")
    assert "  tools: read_file (Read), web_fetch (WebFetch)" in listing.stdout.splitlines()


def test_an_agent_without_tools_gets_every_tool(project: Project) -> None:
    project.approve(write(project.root / ".claude/agents/helper.md",
                          "---\nname: helper\ndescription: Helps.\n---\nHelp.\n"))
    listing = project.dsh("claude", "agents")
    assert listing.returncode == 0, listing.stderr
    assert "  tools: every tool of its plugins (no tools: list)" in listing.stdout.splitlines()
    assert {"read_file", "run_command", "ask_user"} <= set(tool_names(project, "helper"))


def test_a_commands_allowed_tools_may_name_run_command(project: Project) -> None:
    project.approve(write(project.root / ".claude/commands/st.md",
                          "---\nallowed-tools: run_command\n---\nNow: !`echo from-the-shell`\n"))
    project.server.script(Reply(body=openai_completion("ok")))
    run = project.dsh("run", "--json", "/st")
    assert run.returncode == 0, run.stderr
    assert "Now: from-the-shell" in last_user_text(project.server.received[0].body)
