"""``dsh sessions fork`` and ``dsh sessions rewind``: sessions form a tree.

The work is :mod:`dsh.ledger.fork`; this module is the command line. Each prints the new
session's id on stdout (so ``dsh run --session "$(dsh sessions fork ID --at 2)" …`` works in a
pipeline) and what it did on stderr.
"""

from __future__ import annotations

import click

from dsh.cli.commands.sessions import sessions
from dsh.cli.options import resolve_session
from dsh.cli.shared import State
from dsh.cli.shared import pass_state


@sessions.command("fork")
@click.argument("session_id", metavar="ID")
@click.option("--at", "at", type=click.IntRange(min=0), metavar="TURN",
              help="Keep the history up to the end of this turn (default: the last; 0: none).")
@pass_state
def sessions_fork(state: State, session_id: str, at: int | None) -> None:
    """Make a new session whose history is ID's up to the end of turn TURN.

    The fork is a copy: it begins with a `session/fork` line naming ID and TURN and needs
    nothing from ID afterwards. Its next request is what ID would have sent after TURN with
    the same new message. Prints the new id; continue it with `dsh run --session NEW`."""
    from dsh.ledger.fork import fork

    sid = resolve_session(state.app, session_id)
    new = fork(state.app.store, sid, at=at)
    click.echo(new)
    click.echo(f"dsh: forked {sid}" + (f" at turn {at}" if at is not None else "")
               + f" as {new}", err=True)


@sessions.command("rewind")
@click.argument("session_id", metavar="ID")
@click.option("--to", "to", type=click.IntRange(min=0), required=True, metavar="TURN",
              help="Continue from the end of this turn (0: from the start).")
@click.option("--files", is_flag=True,
              help="Also put back the workspace files changed by recorded edits after TURN.")
@click.option("--dry-run", is_flag=True,
              help="With --files: list the files that would be put back; change nothing.")
@click.option("--root", metavar="DIR", type=click.Path(file_okay=False, exists=True),
              help="With --files: the folder the recorded paths are relative to (default: "
                   "the working directory each turn recorded).")
@pass_state
def sessions_rewind(state: State, session_id: str, to: int, files: bool, dry_run: bool,
                    root: str | None) -> None:
    """Continue ID from the end of turn TURN, in a new session (a fork; ID is kept).

    With `--files`, every change a tool recorded after TURN (its sub-agents' too) is undone
    from its recorded diff, newest first, beneath the session's recorded working directory.
    Each file is checked first: one edited, deleted or renamed outside dsh since, or whose
    change was recorded without its whole diff, refuses the rewind naming the file, and
    nothing is written. Prints the new id."""
    from dsh.cli.escape import escape_controls
    from dsh.run.rewind import rewind

    if (dry_run or root) and not files:
        raise click.UsageError("--dry-run and --root go with --files")
    sid = resolve_session(state.app, session_id)
    done = rewind(state.app.store, sid, to=to, files=files, dry_run=dry_run, root=root)
    verb = "would be " if dry_run else ""
    for path, what in done.files:
        click.echo(f"dsh: {verb}{what}: {escape_controls(path)}", err=True)
    if files and not done.files:
        click.echo("dsh: no recorded file changes after turn "
                   f"{to} to undo", err=True)
    if dry_run:
        return
    click.echo(done.session)
    click.echo(f"dsh: rewound {sid} to turn {to} as {done.session}", err=True)
