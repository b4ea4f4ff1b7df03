"""Issue 24 item 5: Claude Code plugin folders (``.claude-plugin/plugin.json``, a local
marketplace) enabled with ``dsh claude add``; their commands and agents appear like the
project's, their skills reach the skills module; a manifest that lies about its paths is a
clear error and changes nothing."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from tests.claude_fixtures import Project
from tests.claude_fixtures import project as project  # noqa: F401 (fixture)
from tests.claude_fixtures import server as server  # noqa: F401 (fixture)
from tests.claude_fixtures import write
from tests.servers import Reply
from tests.servers import openai_completion


def make_plugin(folder: Path, manifest: dict[str, object] | None = None) -> Path:
    write(folder / ".claude-plugin/plugin.json", json.dumps(manifest or {
        "name": "tidy", "version": "1.2.0", "description": "Keeps code tidy"}))
    write(folder / "commands/lint.md", "---\ndescription: Lint a file\n---\nLint $1 now.")
    write(folder / "agents/linter.md",
          "---\nname: linter\ndescription: Lints code.\n---\nYou lint code.")
    write(folder / "skills/style/SKILL.md",
          "---\nname: style\ndescription: The house style.\n---\nUse tabs.")
    write(folder / "hooks/hooks.json", json.dumps({"hooks": {}}))
    write(folder / ".mcp.json", json.dumps({"mcpServers": {}}))
    return folder


def test_add_enables_the_folder_and_its_commands_and_agents_appear(
        project: Project, tmp_path: Path) -> None:
    folder = make_plugin(tmp_path / "tidy-plugin")
    before = project.config.read_text()
    added = project.dsh("claude", "add", str(folder))
    assert added.returncode == 0, added.stderr
    assert added.stdout == f"tidy 1.2.0: {folder.resolve()}\n"
    data = tomllib.loads(project.config.read_text())
    for table, key in (("claude", "plugins"), ("hooks", "claude_plugins"),
                       ("mcp", "claude_plugins")):
        assert data["plugins"][table][key] == [str(folder.resolve())]
    assert data["sessions_dir"] == tomllib.loads(before)["sessions_dir"]  # the rest is kept
    again = project.dsh("claude", "add", str(folder))  # idempotent
    assert again.returncode == 0, again.stderr
    assert tomllib.loads(project.config.read_text()) == data

    listing = project.dsh("claude", "commands")
    assert listing.returncode == 0, listing.stderr
    assert "/tidy:lint\tLint a file  (plugin tidy)" in listing.stdout
    assert "/lint\tLint a file  (alias of /tidy:lint)" in listing.stdout
    project.server.script(Reply(body=openai_completion("linted")),
                          Reply(body=openai_completion("as linter")))
    run = project.dsh("run", "--json", "/tidy:lint main.py")
    assert run.returncode == 0, run.stderr
    assert project.user_messages(json.loads(run.stdout)["session"]) == ["Lint main.py now."]
    run = project.dsh("run", "-a", "linter", "go")
    assert run.returncode == 0, run.stderr
    system = project.server.received[1].body["messages"][0]["content"]
    # the agent file's body, then the catalogue, which holds the folder's skill
    assert system.startswith("You lint code.\n\n# Skills")
    assert "style" in system and "The house style." in system


def test_plugin_skills_reach_the_skills_module(tmp_path: Path) -> None:
    from dsh_claude.folders import plugin_skill_roots
    from dsh_claude.skills import discover_skills

    folder = make_plugin(tmp_path / "tidy-plugin")
    catalogue = discover_skills(plugin_skill_roots({"plugins": [str(folder)]}))
    [skill] = catalogue.skills
    assert skill["name"] == "style" and skill["source"] == "plugin tidy"


def test_marketplace_add_by_name(project: Project, tmp_path: Path) -> None:
    market = tmp_path / "market"
    make_plugin(market / "plugins/tidy")
    write(market / ".claude-plugin/marketplace.json", json.dumps({
        "name": "house", "owner": {"name": "us"},
        "plugins": [{"name": "tidy", "source": "./plugins/tidy"},
                    {"name": "remote", "source": {"source": "github", "repo": "o/r"}}]}))
    added = project.dsh("claude", "add", str(market), "--plugin", "tidy")
    assert added.returncode == 0, added.stderr
    data = tomllib.loads(project.config.read_text())
    assert data["plugins"]["claude"]["plugins"] == [str((market / "plugins/tidy").resolve())]
    missing = project.dsh("claude", "add", str(market), "--plugin", "nope")
    assert missing.returncode == 2
    assert "marketplace.json: no plugin named 'nope' (it lists: tidy, remote)" in missing.stderr
    remote = project.dsh("claude", "add", str(market), "--plugin", "remote")
    assert remote.returncode == 2 and "only a local source" in remote.stderr


@pytest.mark.parametrize(("manifest", "problem"), [
    ({"name": "x", "commands": "../elsewhere"}, "key 'commands': '../elsewhere' must be a "
                                                "relative path starting with './'"),
    ({"name": "x", "commands": "./../elsewhere"}, "leads outside the plugin folder"),
    ({"name": "x", "agents": ["./agents", "/etc"]}, "key 'agents': '/etc' must be a relative"),
    ({"name": "x", "hooks": "./link/hooks.json"}, "leads outside the plugin folder"),
    ({"name": "x", "mcpServers": "./missing.json"}, "does not exist"),
    ({"name": "x", "commands": 3}, "key 'commands': expected a path"),
    ({"name": "../x"}, "key 'name': expected a plugin name"),
    ({"version": "1"}, "key 'name'"),
])
def test_a_manifest_that_lies_about_its_paths_is_refused_and_nothing_changes(
        project: Project, tmp_path: Path, manifest: dict[str, object], problem: str) -> None:
    folder = make_plugin(tmp_path / "liar", manifest)
    write(tmp_path / "elsewhere/evil.md", "Evil")
    write(tmp_path / "outside/hooks.json", "{}")
    (folder / "link").symlink_to(tmp_path / "outside")
    before = project.config.read_text()
    added = project.dsh("claude", "add", str(folder))
    assert added.returncode == 2, added.stderr
    [line] = [x for x in added.stderr.splitlines() if "error" in x]
    assert "plugin.json" in line and problem in line, added.stderr
    assert project.config.read_text() == before


def test_a_broken_folder_in_the_settings_is_one_note_and_the_rest_loads(
        project: Project, tmp_path: Path) -> None:
    good = make_plugin(tmp_path / "good")
    bad = make_plugin(tmp_path / "bad", {"name": "bad", "commands": "./../good/commands"})
    project.write_config(f'[plugins.claude]\nplugins = ["{good}", "{bad}"]\n')
    listing = project.dsh("claude", "commands")
    assert listing.returncode == 0, listing.stderr
    assert "/tidy:lint" in listing.stdout
    notes = [x for x in listing.stderr.splitlines() if "bad" in x]
    assert notes and all("leads outside the plugin folder" in x for x in notes), listing.stderr
