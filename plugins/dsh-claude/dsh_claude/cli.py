"""``dsh claude`` (docs/cli.md): ``add`` enables a Claude Code plugin folder, ``commands``
and ``agents`` list what the project, the user and the enabled folders provide."""

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
    from dsh_claude.folders import from_marketplace
    from dsh_claude.folders import load_plugin

    state = click.get_current_context().obj
    folder = from_marketplace(path, name) if name else path
    plugin = load_plugin(folder)  # a manifest that lies about its paths stops here
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
    click.echo(f"{plugin.name} {plugin.version}".rstrip() + f": {root}")
    click.echo(f"enabled in {config} ({', '.join(KEYS)})", err=True)


@claude.command("commands")
@click.option("-a", "--agent", help="Use this agent's [plugins.claude] settings.")
def list_commands(agent: str | None) -> None:
    """List the custom commands (/NAME) of the project, the user and plugin folders."""
    from dsh.cli.chat_commands import BUILTIN_COMMANDS
    from dsh.cli.shared import warn
    from dsh_claude.commands import describe
    from dsh_claude.commands import discover

    table, notes = discover(_settings(agent))
    builtin = {c.name for c in BUILTIN_COMMANDS}
    for name, cmd in sorted(table.items()):
        desc, hint = describe(cmd)
        extra = f"  (alias of /{cmd.alias})" if cmd.alias else f"  ({cmd.origin})"
        if name in builtin:
            extra += "  [dsh chat: the built-in /" + name + " wins; use it with dsh run]"
        click.echo(f"/{name}{' ' + hint if hint else ''}\t{desc}{extra}")
    for note in notes:
        warn(f"note: {note}")


@claude.command("agents")
def list_agents() -> None:
    """List the sub-agent files found, as the dsh agents they become."""
    from dsh.cli.shared import warn
    from dsh_claude.agents import discover

    state = click.get_current_context().obj
    agents, notes = discover(_settings(None))
    config_agents = state.app.config.agents  # before the merge: the file's own view
    for name, agent, source in agents:
        shadow = "  [overridden by the config's own [agents." + name + "]]" if (
            name in config_agents and state.app.agent_sources.get(name) != source) else ""
        click.echo(f"{name}\t{agent['description'][:120]}\t{source}{shadow}")
    for note in notes:
        warn(f"note: {note}")
