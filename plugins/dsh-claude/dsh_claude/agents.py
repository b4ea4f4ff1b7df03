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

Trust. An agent file chooses a model (a provider the prompt is sent to), tools and a system
prompt, so a file **in the project** (``.claude/agents/``, or a plugin folder inside the
project) takes effect only while its bytes are the ones the person trusted (``dsh trust``,
kind ``agent``; asked once on a terminal, one line otherwise). The user's own files and
plugin folders outside the project are the person's. Whatever its source, a file never
replaces an agent of the config (the config wins, with a note), and one named as dsh's default
agent (``default``, or the config's ``agent``) replaces it only when trusted — with a note
saying which file now is the default agent; untrusted, it is left out with one note.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

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
    return parse_agent(path, root, settings, notes)[:2]


def parse_agent(path: Path, root: Path, settings: Mapping[str, Any], notes: list[str], *,
                follow: bool = False) -> tuple[str, dict[str, Any], bytes]:
    """``(name, [agents.NAME] settings, the bytes read)`` of one agent file, read beneath
    ``root`` (no link followed; ``follow``: the person's own folder, a link resolved once)."""
    from dsh_claude.frontmatter import ClaudeFileError
    from dsh_claude.frontmatter import load_bytes

    data, doc = load_bytes(path, [root], follow=follow)
    name = doc.meta.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        shown = name if not isinstance(name, str) else name[:80]
        raise ClaudeFileError(path, f"key 'name': expected lowercase letters, digits and "
                                    f"'-', not {shown!r}")
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
    return name, out, data


def agent_summary(name: str, agent: Mapping[str, Any], replaces: str = "") -> str:
    """What trusting an agent file decides (the trust question's lines): its name, model,
    tools and the first lines of its system prompt."""
    tools = agent.get("tools")
    lines = [f"agent {name}" + (f" (it would replace {replaces})" if replaces else ""),
             f"model: {agent.get('model') or '(the default model)'}",
             "tools: " + ("every tool of its plugins" if tools is None
                          else ", ".join(tools) or "none"),
             "system prompt:"]
    prompt = str(agent.get("system", "")).splitlines()
    lines += [f"  {line}" for line in prompt[:8]]
    if len(prompt) > 8:
        lines.append(f"  … ({len(prompt) - 8} more lines)")
    return "\n".join(lines)


@attrs.frozen
class AgentFile:
    """One usable agent file: its ``name``, ``[agents.NAME]`` settings, ``source`` (the file),
    the folder it was read beneath (``root``), the bytes read, and whether it lies in the
    project (then trusted only by content)."""

    name: str
    settings: dict[str, Any]
    source: str
    root: Path
    data: bytes = attrs.field(repr=False)
    in_project: bool = False

    def rel(self) -> str:
        import os

        return os.path.relpath(os.path.normpath(os.path.abspath(self.source)),
                               os.path.normpath(os.path.abspath(self.root)))


def discover_files(settings: Mapping[str, Any]) -> tuple[list[AgentFile], list[str]]:
    """Every agent file that parses, first of a name only, and notes (a bad file, a
    shadowed name, a tool left out): one line each. Nothing is trusted or asked here."""
    from dsh_claude.folders import configured_plugins
    from dsh_claude.folders import markdown_files
    from dsh_claude.folders import project_root
    from dsh_claude.folders import user_dir
    from dsh_claude.frontmatter import ClaudeFileError
    from dsh_claude.frontmatter import in_project
    from dsh_claude.frontmatter import inside

    project = project_root(settings)
    plugins, notes = configured_plugins(settings)
    user = user_dir()
    folders = [(project / ".claude" / "agents", project, False),
               (user / "agents", user, not inside(user, [project]))]
    folders += [(folder, p.base, False) for p in plugins for folder in p.agents]
    found: dict[str, AgentFile] = {}
    for folder, root, follow in folders:
        for _ns, path in markdown_files(folder, root, depth=0):
            try:
                name, agent, data = parse_agent(path, root, settings, notes, follow=follow)
            except ClaudeFileError as exc:
                notes.append(f"{exc}; agent file skipped")
                continue
            if name in found:
                notes.append(f"{path}: agent {name!r} is already defined by "
                             f"{found[name].source}: skipped")
                continue
            found[name] = AgentFile(name, agent, str(path), root, data,
                                    in_project(path, project))
    return list(found.values()), notes


def discover(settings: Mapping[str, Any]) -> tuple[list[tuple[str, dict[str, Any], str]],
                                                   list[str]]:
    """``(name, settings, source file)`` of every agent file that parses (trusted or not),
    and notes: one line each."""
    files, notes = discover_files(settings)
    return [(f.name, f.settings, f.source) for f in files], notes


def admit(files: list[AgentFile], configured: Mapping[str, Any], default: str,
          notes: list[str]) -> list[AgentFile]:
    """The files that take effect. A name of the config's own ``[agents.NAME]``: left to the
    config (which wins; the merge says so). A file in the project: only when its bytes are
    trusted (:func:`dsh_claude.frontmatter.gate`: asked once on a terminal, else one line).
    A file named as the default agent (``default``): only when trusted or the person's own,
    with a note saying which file replaced the default agent, or why it did not."""
    from dsh.core.escape import escape_controls
    from dsh_claude.frontmatter import gate

    out: list[AgentFile] = []
    for f in files:
        if f.name in configured:
            out.append(f)  # the config's [agents.NAME] wins in the merge, with its note
            continue
        replaces = f"dsh's default agent {f.name!r}" if f.name == default else ""
        shown = escape_controls(f.source, newlines=False)
        if f.in_project and not gate(f.root, f.rel(), f.data, "agent",
                                     agent_summary(f.name, f.settings, replaces)):
            if replaces:
                notes.append(f"{shown} would replace {replaces} but is not trusted: left out; "
                             f"the default agent is unchanged")
            continue
        if replaces:
            model = f.settings.get("model") or "the default model"
            notes.append(f"{replaces} is now the agent file {shown} "
                         f"({'trusted' if f.in_project else 'your own'}; model {model}), "
                         "replacing dsh's own default agent")
        out.append(f)
    return out


def register_agents(register: Any, app: Any) -> None:
    from dsh_claude.commands import check_settings

    settings = app.config.plugin_settings("claude")
    check_settings(settings, f"{app.config.source or 'config'}: [plugins.claude]")
    if settings.get("agents") is False or settings.get("enabled") is False:
        return
    files, notes = discover_files(settings)
    files = admit(files, app.config.agents, app.config.agent, notes)
    # A bad file or a shadowed name is said at every run; a tool left out only by
    # `dsh claude agents` (it is how the file maps, not a problem).
    from dsh.core.escape import escape_controls

    app.notes.extend(escape_controls(n, newlines=False) for n in notes
                     if "has no dsh equivalent" not in n)
    for f in files:
        register(f.name, f.settings, source=f.source)
