"""dsh_warden: refuse the tools named in ``[plugins.dsh_warden] deny``, count the refusals of
each session as recorded state, and report them with ``dsh warden report SESSION``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

import click

from dsh import StateKey
from dsh import hookimpl
from dsh import pass_app

if TYPE_CHECKING:
    from dsh import App
    from dsh import ToolInvocation

PLUGIN = "dsh_warden"


def count(state: Mapping[str, int], data: Mapping[str, Any]) -> dict[str, int]:
    """Pure: a new value from the old one and the update (both read-only)."""
    tool = str(data["tool"])
    return {**state, tool: state.get(tool, 0) + 1}


#: Refusals per tool in this session: x/dsh_warden/refused events, folded by `count`.
REFUSED: StateKey[dict[str, int]] = StateKey(PLUGIN, "refused", {}, count)


@hookimpl
def pre_execute(call: ToolInvocation) -> None:
    deny = call.handle.plugin_settings(PLUGIN).get("deny", [])
    if call.call.name in deny:
        call.block(f"the warden denies {call.call.name}")
        REFUSED.update({"tool": call.call.name})  # recorded: it survives --session


@hookimpl
def register_commands(cli: click.Group) -> None:
    @cli.group()
    def warden() -> None:
        """The warden's reports."""

    @warden.command()
    @click.argument("session", default="latest")
    @pass_app
    def report(app: App, session: str) -> None:
        """Refusals recorded in SESSION (an id, a unique prefix, or latest)."""
        reader = app.reader(session)  # read-only: no model, no key, no lock
        refused = reader.state(REFUSED)
        click.echo(f"{reader.id}: {sum(refused.values())} refusals")
        for event in reader.plugin_events(PLUGIN, "refused"):
            click.echo(f"  seq {event.seq}: {event.data['tool']}")
