"""``dsh claude`` (docs/cli.md): ``add`` enables a Claude Code plugin folder, ``commands``
and ``agents`` list what the project, the user and the enabled folders provide.

The listings are metadata made of untrusted text (file names, YAML descriptions): every field
goes through :func:`dsh.core.escape.escape_controls` on one line, on a terminal and on a pipe
alike, so an escape sequence (an OSC 52 clipboard write) or a bidirectional override in a
file name or a description is shown as ``\\x1b…`` / ``\\u202e``, never acted on."""

from __future__ import annotations

from typing import Any

import click

#: The config keys ``dsh claude add`` appends the folder to: this plugin's (commands,
#: agents, skills), dsh-hooks' (hooks/hooks.json) and dsh-mcp's (.mcp.json).
KEYS = ("plugins.claude.plugins", "plugins.hooks.claude_plugins", "plugins.mcp.claude_plugins")


def _settings(agent: str | None) -> dict[str, Any]:
    """``[plugins.claude]`` overlaid with the agent's own settings (as the hooks see it)."""
    cfg = click.get_current_context().obj.app.config
    name = agent or cfg.agent
    return {**cfg.plugin_settings("claude"),
            **cfg.agent_config(name).plugin_settings.get("claude", {})}


@click.group(name="claude")
def claude() -> None:
    """Claude Code files of the project: commands, sub-agents, plugin folders."""


def _clean(text: object) -> str:
    from dsh.core.escape import escape_controls

    return escape_controls(str(text), newlines=False)


def _note(note: str) -> None:
    from dsh.cli.shared import warn

    warn(f"note: {_clean(note)}")


@claude.command("add")
@click.argument("path", type=click.Path(file_okay=False))
@click.option("--plugin", "name", metavar="NAME",
              help="PATH is a marketplace (.claude-plugin/marketplace.json): enable its plugin "
                   "NAME.")
def add(path: str, name: str | None) -> None:
    """Enable the Claude Code plugin folder at PATH (its commands, agents, skills, hooks and
    MCP servers) in the user config."""
    import json

    from dsh.config.edit import set_value
    from dsh_claude.folders import MANIFEST
    from dsh_claude.folders import from_marketplace
    from dsh_claude.folders import load_plugin
    from dsh_claude.folders import plugin_summary
    from dsh_claude.folders import project_root

    state = click.get_current_context().obj
    folder = from_marketplace(path, name) if name else path
    project = project_root(_settings(None))
    plugin = load_plugin(folder, project)  # a manifest that lies about its paths stops here
    config = state.config_file()
    cfg = state.app.config
    root = str(plugin.root)
    for key in KEYS:
        _, plugin_name, setting = key.split(".")
        current = cfg.plugin_settings(plugin_name).get(setting) or []
        if not isinstance(current, list):
            raise click.UsageError(f"{config}: {key} is not a list")
        if root not in current:
            set_value(config, key, json.dumps([*current, root]))
    if plugin.in_project:  # a folder the workspace may write: its manifest trusted as shown
        import os

        from dsh.cli.shared import warn
        from dsh.config import trust

        rel = os.path.relpath(plugin.root / MANIFEST, plugin.base)
        trust.approve(plugin.base, rel, trust.digest(plugin.manifest), "plugin")
        warn(f"trusted {_clean(plugin.root / MANIFEST)} (plugin, sha256 "
             f"{trust.digest(plugin.manifest)[:12]}…): "
             + _clean(plugin_summary(plugin).replace(chr(10), "; ")))
    click.echo(_clean(f"{plugin.name} {plugin.version}".rstrip() + f": {root}"))
    click.echo(f"enabled in {config} ({', '.join(KEYS)})", err=True)


@claude.command("commands")
@click.option("-a", "--agent", help="Use this agent's [plugins.claude] settings.")
def list_commands(agent: str | None) -> None:
    """List the custom commands (/NAME) of the project, the user and plugin folders."""
    from dsh.cli.chat_commands import BUILTIN_COMMANDS
    from dsh_claude.commands import describe
    from dsh_claude.commands import discover

    table, notes = discover(_settings(agent))
    builtin = {c.name for c in BUILTIN_COMMANDS}
    for name, cmd in sorted(table.items()):
        desc, hint = describe(cmd)
        extra = f"  (alias of /{_clean(cmd.alias)})" if cmd.alias else f"  ({_clean(cmd.origin)})"
        if name in builtin:
            extra += "  [dsh chat: the built-in /" + name + " wins; use it with dsh run]"
        hint = _clean(hint)
        click.echo(f"/{_clean(name)}{' ' + hint if hint else ''}\t{_clean(desc)}{extra}")
    for note in notes:
        _note(note)


@claude.command("agents")
def list_agents() -> None:
    """List the sub-agent files found, as the dsh agents they become (a file in the project
    that is not trusted is listed, marked: it takes no effect until ``dsh trust approve``),
    each with its tools: the dsh tool each Claude Code name became, and the names left out
    (no dsh tool, or one not available here, and why)."""
    from dsh_claude.agents import discover_files
    from dsh_claude.frontmatter import trusted

    state = click.get_current_context().obj
    files, notes = discover_files(_settings(None), state.app)
    config_agents = state.app.config.agents  # before the merge: the file's own view
    for f in files:
        name = f.name
        mark = "  [overridden by the config's own [agents." + name + "]]" if (
            name in config_agents and state.app.agent_sources.get(name) != f.source) else ""
        if f.in_project and not trusted(f.root, f.rel(), f.data):
            mark += "  [not trusted: dsh trust approve " + _clean(f.source) + "]"
        click.echo(f"{_clean(name)}\t{_clean(f.settings['description'][:120])}\t"
                   f"{_clean(f.source)}{mark}")
        for line in _tool_lines(f.tool_names):
            click.echo(_clean(line))
    for note in notes:
        _note(note)


def _tool_lines(names: Any) -> list[str]:
    """An agent file's tools, under its line: ``tools: read_file (Read), …``; then the names
    left out: ``no dsh tool: WebSearch (dsh has no web search tool)``, and ``not available
    here: WebFetch → web_fetch (install dsh-web …)`` (its plugin is not installed or off)."""
    if names is None:
        return ["  tools: every tool of its plugins (no tools: list)"]
    kept = []
    for n in names:
        if n.tool is not None:
            detail = ": ".join(d for d in (n.given if n.given != n.tool else "", n.why) if d)
            kept.append(f"{n.tool} ({detail})" if detail else n.tool)
    lines = ["  tools: " + (", ".join(dict.fromkeys(kept)) or "none")]
    none = [f"{n.given} ({n.why})" for n in names if n.wanted is None]
    if none:
        lines.append("  no dsh tool: " + ", ".join(none))
    absent = [(n.given if n.given == n.wanted else f"{n.given} → {n.wanted}") + f" ({n.why})"
              for n in names if n.wanted is not None and n.tool is None]
    if absent:
        lines.append("  not available here: " + ", ".join(absent))
    return lines
