"""``dsh replay``: rebuild every request of a session from its ledger and compare it with the
one recorded as sent (:mod:`dsh.run.replay`); ``--model`` re-runs its inputs on another model.

Imported on demand by :class:`dsh.cli.root.DshGroup`.
"""

from __future__ import annotations

import sys

import click

from dsh.cli.shared import State
from dsh.cli.shared import pass_state
from dsh.cli.shared import warn


@click.command("replay")
@click.argument("session_id", metavar="ID")
@click.option("-m", "--model", metavar="MODEL",
              help="Instead, send the session's user inputs to MODEL, for real, into a new "
                   "session (A/B); prints its id on stderr and the answers on stdout.")
@click.option("--no-children", "no_children", is_flag=True,
              help="Do not replay the sessions of the sub-agents it called.")
@pass_state
def replay(state: State, session_id: str, model: str | None, no_children: bool) -> None:
    """Replay session ID: rebuild each request from its ledger under today's code, config
    and plugins, answer it with the recorded response (no model is called, no tool runs)
    and compare it, byte for byte, with the request recorded as sent.

    Exit 0 when every request matches; 1 with the first divergence (its request, turn,
    step and field on stderr, a unified diff on stdout).
    """
    app = state.app
    if model is not None:
        from dsh.run.replay import rerun

        new_id, results = rerun(app, session_id, model,
                                on_session=lambda sid: warn(f"replay: new session {sid}"))
        for result in results:
            _echo(result.output)
        failed = [r for r in results if r.outcome != "completed"]
        if failed:
            r = failed[0]
            warn(f"error: session {new_id}: a turn ended with {r.outcome}: {r.reason}")
            sys.exit(1)
        return
    from dsh.run.replay import replay as run_replay

    report = run_replay(app, session_id, children=not no_children)
    for note in report.notes:
        warn(f"replay: note: {note}")
    found = report.first_divergence
    if found is None:
        click.echo(report.summary(), err=True)
        return
    _, divergence = found
    if divergence.diff:
        _echo(divergence.diff.rstrip("\n"))
    warn(f"error: {report.summary().removeprefix('replay: ')}")
    sys.exit(1)


def _echo(text: str) -> None:
    if sys.stdout.isatty():
        from dsh.cli.escape import escape_controls

        text = escape_controls(text)
    click.echo(text)
