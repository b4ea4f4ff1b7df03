"""Sub-agent files: ``.claude/agents/*.md`` (project), ``~/.claude/agents/*.md`` (user) and
the ``agents/`` of enabled Claude Code plugin folders become dsh agents (the
``register_agents`` hook), usable as ``dsh run -a NAME`` and as sub-agents
(``[agents.MAIN] subagents = ["NAME"]`` in the config: delegating changes what the main
agent's model sees, its tools, so it is asked for by name).

A file's frontmatter: ``name`` (required; lowercase letters, digits, ``-``), ``description``
(required: the ``ask_NAME`` tool's description), ``tools`` (a comma list of Claude Code tool
names, mapped to dsh tools by :func:`map_tools`; absent: every tool of the agent's plugins),
``model`` (:func:`map_model`); the body is the system prompt. The config's own
``[agents.NAME]`` wins a collision (a note says so), the project's files win over the
user's, the user's over plugin folders'.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: ``model:`` of an agent or command file → dsh model id (``[plugins.claude] models``
#: overrides it, key by key). ``inherit``: the parent agent's model.
MODELS = {"sonnet": "anthropic:claude-sonnet-4-5", "opus": "anthropic:claude-opus-4-1",
          "haiku": "anthropic:claude-haiku-4-5", "inherit": "inherit"}
#: Claude Code tool names → the dsh tools doing the same (dsh-shell's). Names not here are
#: kept when they look like a dsh tool name (``read_file``) and dropped otherwise, with a note.
TOOLS = {"Bash": "run_command", "Read": "read_file", "Write": "write_file",
         "Edit": "write_file", "MultiEdit": "write_file"}
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_DSH_TOOL = re.compile(r"[a-z][a-z0-9_]{0,63}")


def map_model(model: str, settings: Mapping[str, Any]) -> str:
    """``sonnet``/``opus``/``haiku``/``inherit`` through :data:`MODELS` (and the settings'
    ``models`` table); a full Claude model name (``claude-…``) gets ``anthropic:``; any
    other id (``openai:gpt-4o``, ``scripted:…``) is kept."""
    table = {**MODELS, **{k: v for k, v in (settings.get("models") or {}).items()
                          if isinstance(v, str)}}
    model = model.strip()
    if model in table:
        return table[model]
    if model.startswith("claude-"):
        return f"anthropic:{model}"
    return model


def map_tools(value: Any, path: Path, settings: Mapping[str, Any],
              notes: list[str]) -> list[str] | None:
    """The dsh allow list of a ``tools`` value (None: every tool)."""
    from dsh_claude.commands import _string_list

    names = _string_list(value, "tools", path)
    if value is None:
        return None
    table = {**TOOLS, **{k: v for k, v in (settings.get("tools") or {}).items()
                         if isinstance(v, str)}}
    out: list[str] = []
    for name in names:
        base = name.split("(", 1)[0].strip()
        mapped = table.get(base) or (base if _DSH_TOOL.fullmatch(base) else None)
        if mapped is None:
            notes.append(f"{path}: tool {base!r} has no dsh equivalent: left out")
        elif mapped not in out:
            out.append(mapped)
    return out


def read_agent(path: Path, root: Path, settings: Mapping[str, Any],
               notes: list[str]) -> tuple[str, dict[str, Any]]:
    """``(name, [agents.NAME] settings)`` of one agent file."""
    from dsh_claude.frontmatter import ClaudeFileError
    from dsh_claude.frontmatter import load

    doc = load(path, [root])
    name = doc.meta.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ClaudeFileError(path, f"key 'name': expected lowercase letters, digits and "
                                    f"'-', not {name!r}")
    description = doc.meta.get("description")
    if not isinstance(description, str) or not description.strip():
        raise ClaudeFileError(path, "key 'description': required (it says when to "
                                    "delegate to this agent)")
    out: dict[str, Any] = {"description": description.strip(), "system": doc.body.strip()}
    tools = map_tools(doc.meta.get("tools"), path, settings, notes)
    if tools is not None:
        out["tools"] = tools
    model = doc.meta.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise ClaudeFileError(path, "key 'model': expected a model name")
        out["model"] = map_model(model, settings)
    return name, out


def discover(settings: Mapping[str, Any]) -> tuple[list[tuple[str, dict[str, Any], str]],
                                                   list[str]]:
    """``(name, settings, source file)`` of every usable agent file, and notes (a bad file,
    a shadowed name, a tool left out): one line each."""
    from dsh_claude.folders import configured_plugins
    from dsh_claude.folders import markdown_files
    from dsh_claude.folders import project_root
    from dsh_claude.folders import user_dir
    from dsh_claude.frontmatter import ClaudeFileError

    project = project_root(settings)
    plugins, notes = configured_plugins(settings)
    folders = [(project / ".claude" / "agents", project), (user_dir() / "agents", user_dir())]
    folders += [(folder, p.root) for p in plugins for folder in p.agents]
    found: dict[str, tuple[dict[str, Any], str]] = {}
    for folder, root in folders:
        for _ns, path in markdown_files(folder, root, depth=0):
            try:
                name, agent = read_agent(path, root, settings, notes)
            except ClaudeFileError as exc:
                notes.append(f"{exc}; agent file skipped")
                continue
            if name in found:
                notes.append(f"{path}: agent {name!r} is already defined by "
                             f"{found[name][1]}: skipped")
                continue
            found[name] = (agent, str(path))
    return [(n, a, src) for n, (a, src) in found.items()], notes


def register_agents(register: Any, app: Any) -> None:
    from dsh_claude.commands import check_settings

    settings = app.config.plugin_settings("claude")
    check_settings(settings, f"{app.config.source or 'config'}: [plugins.claude]")
    if settings.get("agents") is False or settings.get("enabled") is False:
        return
    agents, notes = discover(settings)
    # A bad file or a shadowed name is said at every run; a tool left out only by
    # `dsh claude agents` (it is how the file maps, not a problem).
    app.notes.extend(n for n in notes if "has no dsh equivalent" not in n)
    for name, agent, source in agents:
        register(name, agent, source=source)
