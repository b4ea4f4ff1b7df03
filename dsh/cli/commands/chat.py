"""``dsh chat``: the click command; the chat itself is :mod:`dsh.chat`.

Imported on demand by :class:`dsh.cli.root.DshGroup`. Its options and the agent they assemble are
those of ``dsh run`` (:func:`dsh.cli.options.agent_overrides`,
:func:`dsh.cli.options.assemble_agent`).
"""

from __future__ import annotations

import click

from dsh.cli.options import MODE_HELP
from dsh.cli.options import agent_and_session_options
from dsh.cli.options import agent_overrides
from dsh.cli.options import assemble_agent
from dsh.cli.options import keep_session_model
from dsh.cli.options import note_default_model
from dsh.cli.options import note_model_switch
from dsh.cli.options import note_unpriced
from dsh.cli.options import note_yes
from dsh.cli.options import parse_limits
from dsh.cli.options import session_to_resume
from dsh.cli.shared import State
from dsh.cli.shared import pass_state


@click.command()
@agent_and_session_options
@click.option("--max-steps", type=click.IntRange(min=1), help="Steps allowed in each turn.")
@click.option("-L", "--limit", "limits", multiple=True, metavar="KEY=VALUE",
              help="Budget limit of each turn (repeatable), as for dsh run.")
@click.option("-o", "--option", "options", multiple=True, metavar="KEY=VALUE",
              help="Model option, e.g. -o temperature=0.2 (repeatable).")
@click.option("-T", "--tool", "tools", multiple=True, metavar="NAME",
              help="Allow only this tool (repeatable, or comma-separated).")
@click.option("--no-tools", is_flag=True, help="Offer the model no tool at all (also -T '').")
@click.option("--mode", metavar="MODE", default=None, help=MODE_HELP)
@click.option("--yes", is_flag=True, help="Approve every tool call that would ask.")
@pass_state
def chat(state: State, model: str | None, system: str | None, agent: str | None,
         continue_: bool, any_dir: bool, session_id: str | None, max_steps: int | None,
         limits: tuple[str, ...], options: tuple[str, ...], tools: tuple[str, ...],
         no_tools: bool, mode: str | None, yes: bool) -> None:
    """Talk with an agent: type while it works to steer it.

    A line typed while a turn runs is taken at the turn's next step boundary; start it with
    > to keep it for after the turn. /help lists the commands. Without a terminal, reads one
    message per line from stdin. The session can be continued by dsh run --session ID.
    -c continues the latest session of the current directory, on the model it recorded.
    """
    if continue_ and session_id:
        raise click.UsageError("--continue and --session cannot be combined")
    if any_dir and not continue_:
        raise click.UsageError("--any-dir applies to -c/--continue")
    budget = parse_limits(limits)
    app = state.app
    assembled, overrides = assemble_agent(
        app, agent, agent_overrides(model, system, max_steps, options, mode), tools, no_tools,
        note=False)
    note_yes(yes, assembled)
    resume = session_to_resume(app, assembled, continue_, session_id, any_dir)
    assembled, overrides = keep_session_model(app, assembled, overrides, resume)
    note_default_model(app, assembled, overrides)
    note_unpriced(assembled, budget)
    from dsh.cli.repl import Chat

    session = app.open_session(assembled, resume)
    note_model_switch()
    ui = Chat(app, session, agent=agent, overrides=overrides, approve=yes, limits=budget)
    try:
        code = ui.run()
    finally:
        ui.session.close()  # /fork and /rewind move the chat to another session
    click.get_current_context().exit(code)
