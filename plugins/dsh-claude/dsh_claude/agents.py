"""Sub-agent files: ``.claude/agents/*.md`` (project), ``~/.claude/agents/*.md`` (user) and
the ``agents/`` of enabled Claude Code plugin folders become dsh agents (the
``register_agents`` hook), usable as ``dsh run -a NAME`` and as sub-agents
(``[agents.MAIN] subagents = ["NAME"]`` in the config: delegating changes what the main
agent's model sees, its tools, so it is asked for by name).

A file's frontmatter: ``name`` (required; lowercase letters, digits, ``-``), ``description``
(required: the ``ask_NAME`` tool's description), ``tools`` (a comma list of Claude Code tool
names, mapped to dsh tools by :func:`map_tools` through :data:`TOOLS`; a name with no dsh tool
(:data:`NO_TOOL`), or whose tool is not available here (:func:`availability`: its plugin is
not installed or not enabled), is left out with a note that ``dsh claude agents`` shows;
absent: every tool of the agent's plugins),
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
#: Claude Code tool names → the dsh tool doing the same (docs/claude.md, "Tool names"): the
#: one table for sub-agent files' ``tools``, skills' and commands' ``allowed-tools``
#: (``[plugins.claude] tools`` adds or changes entries). A name not here is kept when it looks
#: like a dsh tool name (``read_file``) and dropped otherwise, with a note. ``NotebookEdit``:
#: a notebook is a JSON text file, edited as one (wider than a cell editor: any file; each
#: write is still approved as every edit is).
TOOLS = {
    "Read": "read_file", "NotebookRead": "read_file",
    "Write": "write_file",
    "Edit": "edit_file", "NotebookEdit": "edit_file",
    "MultiEdit": "multi_edit",
    "Bash": "run_command", "BashOutput": "job_output", "KillShell": "job_kill",
    "KillBash": "job_kill",
    "Grep": "grep", "Glob": "glob", "LS": "list_dir",
    "WebFetch": "web_fetch",
    "TodoWrite": "update_tasks",
    "AskUserQuestion": "ask_user",
}
#: Claude Code tool names dsh has no tool for, and what to do instead.
NO_TOOL = {
    "WebSearch": "dsh has no web search tool",
    "Task": "delegation is named in the config: [agents.MAIN] subagents = [\"NAME\"] gives "
            "an ask_NAME tool",
    "SlashCommand": "custom commands are run by the person (/NAME), not by the model",
    "ExitPlanMode": "dsh's plan mode (--mode plan) offers propose_plan by itself",
    "Skill": "list the dsh names skill, skill_file to keep the skill tools",
}
#: Where each dsh tool of :data:`TOOLS` comes from: ``(plugin, settings key that must be
#: true or "", what to tell the person)``, for :func:`availability`.
PROVIDERS: dict[str, tuple[str, str, str]] = {
    **{tool: ("shell", "", "install dsh-shell") for tool in (
        "read_file", "write_file", "edit_file", "multi_edit", "apply_patch", "run_command",
        "job_output", "job_kill", "grep", "glob", "list_dir", "ask_user")},
    "web_fetch": ("web", "enabled", "install dsh-web and set [plugins.web] enabled = true"),
    "update_tasks": ("dsh.tasks", "enabled", 'set [plugins."dsh.tasks"] enabled = true'),
}
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_DSH_TOOL = re.compile(r"[a-z][a-z0-9_]{0,63}")
#: The notes of how a file's tools map (shown by ``dsh claude agents``, not at every run).
MAPPING_NOTES = ("has no dsh equivalent", "is not available here")


@attrs.frozen
class ToolName:
    """How one name of a ``tools`` list maps: ``given`` (as written, ``Bash(git diff:*)``),
    ``wanted`` (the dsh tool it means, None: none), ``tool`` (the dsh tool the agent gets, or
    None: left out) and ``why`` (why it was left out, or that a pattern is not enforced)."""

    given: str
    wanted: str | None
    tool: str | None
    why: str = ""

    @property
    def base(self) -> str:
        """The name without its pattern: ``Bash``."""
        return self.given.split("(", 1)[0].strip()


def availability(app: Any) -> Any:
    """``why_not(tool)`` for the agents of ``app``: ``""`` when the dsh tool will be there
    (its plugin is loaded, and enabled when it must be: :data:`PROVIDERS`; a name not in that
    table is assumed to be), else what to do to have it. A sub-agent file sets no plugin
    settings of its own, so the config's ``[plugins.NAME]`` decide."""
    pm = getattr(app, "pm", None)

    def why_not(tool: str) -> str:
        provider = PROVIDERS.get(tool)
        if provider is None or pm is None:
            return ""
        plugin, key, fix = provider
        if pm.get_plugin(plugin) is None:
            return fix
        if key and app.config.plugin_settings(plugin).get(key) is not True:
            return fix
        return ""

    return why_not


def map_names(value: Any, path: Path, settings: Mapping[str, Any],
              why_not: Any = None) -> list[ToolName] | None:
    """Each name of a ``tools`` value and the dsh tool it becomes (None: every tool)."""
    from dsh_claude.commands import _string_list

    names = _string_list(value, "tools", path)
    if value is None:
        return None
    table = {**TOOLS, **{k: v for k, v in (settings.get("tools") or {}).items()
                         if isinstance(v, str)}}
    out: list[ToolName] = []
    for name in names:
        given = name.strip()
        base = given.split("(", 1)[0].strip()
        mapped = table.get(base) or (base if _DSH_TOOL.fullmatch(base) else None)
        if mapped is None:
            out.append(ToolName(given, None, None,
                                NO_TOOL.get(base, "no dsh tool of that name")))
            continue
        missing = why_not(mapped) if why_not is not None else ""
        if missing:
            out.append(ToolName(given, mapped, None, missing))
        elif given != base:
            out.append(ToolName(given, mapped, mapped, "its pattern is not enforced"))
        else:
            out.append(ToolName(given, mapped, mapped))
    return out


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
              notes: list[str], why_not: Any = None,
              names: list[ToolName] | None = None) -> list[str] | None:
    """The dsh allow list of a ``tools`` value (None: every tool); a name left out is a
    note. ``why_not``: :func:`availability`; ``names``: filled with :func:`map_names`'
    entries (for ``dsh claude agents``)."""
    mapped = map_names(value, path, settings, why_not)
    if mapped is None:
        return None
    if names is not None:
        names.extend(mapped)
    out: list[str] = []
    for entry in mapped:
        if entry.wanted is None:
            notes.append(f"{path}: tool {entry.base!r} has no dsh equivalent ({entry.why}): "
                         "left out")
        elif entry.tool is None:
            notes.append(f"{path}: tool {entry.base!r} ({entry.wanted}) is not available here "
                         f"({entry.why}): left out")
        elif entry.tool not in out:
            out.append(entry.tool)
    return out


def read_agent(path: Path, root: Path, settings: Mapping[str, Any],
               notes: list[str]) -> tuple[str, dict[str, Any]]:
    """``(name, [agents.NAME] settings)`` of one agent file."""
    return parse_agent(path, root, settings, notes)[:2]


def parse_agent(path: Path, root: Path, settings: Mapping[str, Any], notes: list[str], *,
                follow: bool = False, why_not: Any = None,
                names: list[ToolName] | None = None) -> tuple[str, dict[str, Any], bytes]:
    """``(name, [agents.NAME] settings, the bytes read)`` of one agent file, read beneath
    ``root`` (no link followed; ``follow``: the person's own folder, a link resolved once).
    ``why_not`` and ``names``: as for :func:`map_tools`."""
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
    tools = map_tools(doc.meta.get("tools"), path, settings, notes, why_not, names)
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
    #: How each name of its ``tools`` maps (None: it has no ``tools``: every tool).
    tool_names: tuple[ToolName, ...] | None = None

    def rel(self) -> str:
        import os

        return os.path.relpath(os.path.normpath(os.path.abspath(self.source)),
                               os.path.normpath(os.path.abspath(self.root)))


def discover_files(settings: Mapping[str, Any], app: Any = None
                   ) -> tuple[list[AgentFile], list[str]]:
    """Every agent file that parses, first of a name only, and notes (a bad file, a
    shadowed name, a tool left out): one line each. Nothing is trusted or asked here. With
    ``app``, a tool its plugins will not provide is left out (:func:`availability`)."""
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
    why_not = availability(app) if app is not None else None
    for folder, root, follow in folders:
        for _ns, path in markdown_files(folder, root, depth=0):
            names: list[ToolName] = []
            try:
                name, agent, data = parse_agent(path, root, settings, notes, follow=follow,
                                                why_not=why_not, names=names)
            except ClaudeFileError as exc:
                notes.append(f"{exc}; agent file skipped")
                continue
            if name in found:
                notes.append(f"{path}: agent {name!r} is already defined by "
                             f"{found[name].source}: skipped")
                continue
            found[name] = AgentFile(name, agent, str(path), root, data,
                                    in_project(path, project),
                                    tuple(names) if "tools" in agent else None)
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
    files, notes = discover_files(settings, app)
    files = admit(files, app.config.agents, app.config.agent, notes)
    # A bad file or a shadowed name is said at every run; a tool left out only by
    # `dsh claude agents` (it is how the file maps, not a problem).
    from dsh.core.escape import escape_controls

    app.notes.extend(escape_controls(n, newlines=False) for n in notes
                     if not any(m in n for m in MAPPING_NOTES))
    for f in files:
        register(f.name, f.settings, source=f.source)
