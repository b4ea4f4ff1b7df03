"""``dsh doctor``: is this machine set up to run agents? One line per check, each ``ok``,
``warning`` or ``fail``, each failure with its fix.

The checks reuse what the other commands do: the config is loaded and every agent assembled as
``dsh config validate`` does, the models are built as ``dsh run`` builds them (keys looked up
as the adapters look them up, never shown), the sandbox is :func:`dsh.sandbox.spawn.check`
(``dsh sandbox check``), the plugins are the records ``dsh plugins`` lists, and the session
index is read, never written. No request is sent unless ``--check-models`` asks for one tiny
request per network model. The checks themselves are :mod:`dsh.cli.doctor_checks`.
"""

from __future__ import annotations

import sys

import click

from dsh.cli.shared import State
from dsh.cli.shared import pass_state

#: Exit codes: 0 when no check failed (warnings allowed), 1 when one did.
EXIT_OK = 0
EXIT_FAILED = 1


@click.command()
@click.option("--check-models", is_flag=True,
              help="Also send one tiny request to each configured network model (uses the "
                   "network and, for a paid API, a few tokens).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the checks as a JSON array of {check, status, message, fix}.")
@pass_state
def doctor(state: State, check_models: bool, as_json: bool) -> None:
    """Check the set-up: config, agents, models and their keys, plugins, sandbox, sessions.

    One line per check: ok, warning or fail; a failure says how to fix it. Sends no request
    unless --check-models is given. Exits 0 when no check failed, 1 when one did.
    """
    from dsh.cli.doctor_checks import run_checks

    results = run_checks(state, check_models=check_models)
    if as_json:
        import json

        click.echo(json.dumps(results, indent=2, ensure_ascii=False))
    else:
        from dsh.cli.escape import escape_controls

        for r in results:
            line = f"{r['status']:<8} {r['check']}: {r['message']}"
            if r.get("fix"):
                line += f" — fix: {r['fix']}"
            # config values, plugin errors and server answers: never raw to the terminal
            click.echo(escape_controls(line, newlines=False))
        failed = sum(r["status"] == "fail" for r in results)
        warned = sum(r["status"] == "warning" for r in results)
        click.echo(f"dsh: doctor: {len(results)} checks, {failed} failed, {warned} warnings",
                   err=True)
    sys.exit(EXIT_FAILED if any(r["status"] == "fail" for r in results) else EXIT_OK)
