"""``dsh plugins``, ``tools``, ``models``, ``agents``: what is installed and configured.

Imported on demand by :class:`dsh.cli.root.DshGroup`; the views themselves are in
:mod:`dsh.cli.inventories`. ``dsh install`` / ``dsh uninstall`` are in
:mod:`dsh.cli.commands.install`.
"""

from __future__ import annotations

import click

from dsh.cli.shared import State
from dsh.cli.shared import _dump
from dsh.cli.shared import pass_state
from dsh.cli.shared import warn


@click.command()
@click.option("--all", "show_all", is_flag=True, help="Include the built-in subsystems.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@pass_state
def plugins(state: State, show_all: bool, as_json: bool) -> None:
    """List plugins: distribution, hooks, agents using them, commands, load errors."""
    from dsh.cli.inventories import plugin_rows
    from dsh.cli.inventories import plugins_text

    commands: dict[str, list[str]] = {}
    for cmd, (plugin, _) in state.plugin_commands().items():
        commands.setdefault(plugin, []).append(cmd)
    rows = plugin_rows(state.app, commands, show_all)
    if as_json:
        _dump(rows)
    elif rows:
        click.echo(plugins_text(rows))
    else:
        warn("no plugins installed (--all shows the built-ins)")


@click.command()
@click.option("-a", "--agent", help="Agent whose tools to list (default: the config's agent).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@pass_state
def tools(state: State, agent: str | None, as_json: bool) -> None:
    """List the tools an agent can call, with their plugin and parameters."""
    from dsh.cli.inventories import tool_rows
    from dsh.cli.inventories import tools_text

    rows = tool_rows(state.app.agent(agent).tools.values())
    if as_json:
        _dump(rows)
    elif rows:
        click.echo(tools_text(rows))
    else:
        warn("no tools")


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@click.pass_context
def models(ctx: click.Context, as_json: bool) -> None:
    """List model adapters (use PREFIX:NAME) and the models configured in [models].

    `dsh models alias` gives a model a short name.
    """
    if ctx.invoked_subcommand is not None:
        return
    from dsh.cli.inventories import models_report
    from dsh.cli.inventories import models_text

    report = models_report(ctx.find_object(State).app)
    _dump(report) if as_json else click.echo(models_text(report))


@models.command("alias")
@click.argument("name", required=False)
@click.argument("target", required=False)
@click.option("--list", "list_", is_flag=True, help="List the aliases (also with no NAME).")
@click.option("--remove", "remove", is_flag=True, help="Remove the alias NAME.")
@click.option("--json", "as_json", is_flag=True, help="With --list: print a JSON array.")
@pass_state
def models_alias(state: State, name: str | None, target: str | None, list_: bool,
                 remove: bool, as_json: bool) -> None:
    """Make NAME an alias of the model TARGET (openai:gpt-4o), list or remove aliases.

    An alias is a [models.NAME] table with `adapter` and `model` keys, written to the config
    file (validated first, as `dsh config set` writes); `dsh run -m NAME` then uses TARGET.
    """
    from dsh.cli import model_alias

    path = state.config_file()
    if remove:
        if name is None or target is not None or list_:
            raise click.UsageError("--remove takes one NAME (dsh models alias --remove NAME)")
        model_alias.remove(path, name)
        warn(f"removed the alias {name} from {path}")
    elif list_ or name is None:
        if name is not None:
            raise click.UsageError("--list takes no NAME")
        rows = model_alias.rows(path)
        if as_json:
            _dump(rows)
        elif rows:
            click.echo(model_alias.text(rows))
        else:
            warn(f"no aliases in {path} (dsh models alias NAME TARGET makes one)")
    else:
        if target is None:
            raise click.UsageError("missing TARGET: dsh models alias NAME TARGET "
                                   "(e.g. dsh models alias fast openai:gpt-4o-mini)")
        for note in model_alias.define(state, path, name, target):
            warn(f"note: {note}")
        warn(f"alias {name} -> {target} written to {path}")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@pass_state
def agents(state: State, as_json: bool) -> None:
    """List agents: model, plugins, tools, step limit and system prompt parts."""
    from dsh.cli.inventories import agent_rows
    from dsh.cli.inventories import agents_text

    rows = agent_rows(state.app)
    _dump(rows) if as_json else click.echo(agents_text(rows))
