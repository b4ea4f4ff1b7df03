"""The plugin's settings: ``[plugins.claude]`` overlaid with
``[agents.NAME.plugin_settings.claude]`` (docs/config.md, "dsh-claude").

Everything is on by default for an agent the plugin reaches (``plugins = ["claude"]``, or every
agent that lists no plugins): installing it is the opt-in, and an agent opts out with
``instructions = false`` / ``agents_md = false`` / ``claude_md = false`` / ``agent_skills =
false``, or by listing plugins without ``claude``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from dsh.core.errors import ConfigError

PLUGIN = "claude"
KEYS = ("instructions", "agents_md", "claude_md", "user_agents_md", "user_claude_md",
        "agent_skills", "skills", "user_skills", "root",
        # i24b's (dsh_claude.commands / agents / folders check their own values):
        "commands", "command_shell", "agents", "plugins", "models", "tools")


@attrs.frozen
class Settings:
    instructions: bool = True
    agents_md: bool = True
    claude_md: bool = True
    #: The user-level AGENTS.md (Codex's place by default); "" for none.
    user_agents_md: str = "~/.codex/AGENTS.md"
    #: The user-level CLAUDE.md; "" for none.
    user_claude_md: str = "~/.claude/CLAUDE.md"
    agent_skills: bool = True
    #: More skill folders: each is a folder of skill folders (``X/NAME/SKILL.md``) or one
    #: skill folder (``X/SKILL.md``).
    skills: tuple[str, ...] = ()
    #: Read ``~/.claude/skills``.
    user_skills: bool = True
    #: The project root; "" finds it: the nearest ancestor of the working directory with
    #: ``.git``, else the working directory.
    root: str = ""

    @property
    def any_instructions(self) -> bool:
        return self.instructions and (self.agents_md or self.claude_md)


def claude_dir() -> Path:
    """Claude Code's user folder: ``$CLAUDE_CONFIG_DIR`` when set (as Claude Code reads it),
    else ``~/.claude``."""
    return Path(os.environ.get("CLAUDE_CONFIG_DIR") or os.path.expanduser("~/.claude"))


def codex_dir() -> Path:
    """Codex's user folder: ``$CODEX_HOME`` when set (as Codex reads it), else ``~/.codex``."""
    return Path(os.environ.get("CODEX_HOME") or os.path.expanduser("~/.codex"))


def expand(path: str) -> Path:
    """``~`` expanded; ``~/.claude/…`` and ``~/.codex/…`` are :func:`claude_dir` and
    :func:`codex_dir`, so the variables those tools honour move dsh's reading too."""
    for prefix, folder in (("~/.claude", claude_dir), ("~/.codex", codex_dir)):
        if path == prefix or path.startswith(prefix + "/"):
            return folder() / path[len(prefix) + 1:] if path != prefix else folder()
    return Path(os.path.expanduser(path))


def parse_settings(raw: Mapping[str, Any], where: str) -> Settings:
    """Checked settings; :class:`ConfigError` naming ``where`` and the key."""
    unknown = sorted(set(raw) - set(KEYS) - {"enabled"})
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(KEYS)})")
    values: dict[str, Any] = {}
    for key in ("instructions", "agents_md", "claude_md", "agent_skills", "user_skills"):
        if key in raw:
            if not isinstance(raw[key], bool):
                raise ConfigError(f"{where}: key {key!r}: expected true or false, not "
                                  f"{raw[key]!r}")
            values[key] = raw[key]
    for key in ("user_agents_md", "user_claude_md", "root"):
        if key in raw:
            if not isinstance(raw[key], str):
                raise ConfigError(f"{where}: key {key!r}: expected a path (text), not "
                                  f"{raw[key]!r}")
            values[key] = raw[key]
    if "skills" in raw:
        paths = raw["skills"]
        if not isinstance(paths, (list, tuple)) or not all(isinstance(p, str) and p
                                                           for p in paths):
            raise ConfigError(f"{where}: key 'skills': expected a list of folder paths, not "
                              f"{paths!r}")
        values["skills"] = tuple(paths)
    if raw.get("enabled") is False:  # [plugins.claude] enabled = false: all off
        values.update(instructions=False, agent_skills=False)
    return Settings(**values)


def for_agent(agent: Any) -> Settings:
    """The settings of ``agent`` (an :class:`dsh.AgentHandle`)."""
    return parse_settings(agent.plugin_settings(PLUGIN),
                          where=f"plugins.claude, agent {getattr(agent, 'name', '?')}")


def project_root(settings: Settings, cwd: Path | None = None) -> Path:
    """The project root: ``root`` if set, else the nearest ancestor of ``cwd`` (the working
    directory) holding ``.git`` (a real one, not a link), else ``cwd``. The home directory
    and ``/`` are never found as a project root this way (a dotfiles repository in ``$HOME``
    would otherwise let a project's ``@import`` reach every file in it): a folder below them
    is its own root then."""
    here = (cwd or Path.cwd()).resolve()
    if settings.root:
        return expand(settings.root).resolve()
    home = Path(os.path.expanduser("~")).resolve()
    for folder in (here, *here.parents):
        if folder in (home, Path("/")) and folder != here:
            break
        if os.path.lexists(folder / ".git") and not (folder / ".git").is_symlink():
            return folder
    return here
