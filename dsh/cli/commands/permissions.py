"""``dsh permissions``: the grants a person gave ("always for this project"), kept in dsh's own
config directory per project root (dsh/tools/approval.py; docs/security.md, "Permission modes
and approvals")."""

from __future__ import annotations

import os

import click

from dsh.cli.shared import warn


@click.group()
def permissions() -> None:
    """List and revoke the grants given at the approval question ("always for this project")."""


@permissions.command("list")
@click.option("--all", "everywhere", is_flag=True, help="Every project's grants, not only "
              "this directory's.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def permissions_list(everywhere: bool, as_json: bool) -> None:
    """The grants of the project in the current directory (numbered, for revoke)."""
    import json

    from dsh.core.escape import escape_controls
    from dsh.tools.grants import load_grants

    here = os.path.realpath(".")
    for root, grants in sorted(load_grants().items()):
        if not everywhere and root != here:
            continue
        for number, grant in enumerate(grants, 1):
            if as_json:
                click.echo(json.dumps({"project": root, "number": number, **grant},
                                      ensure_ascii=False))
                continue
            shown = escape_controls(f"{grant.get('scope')} {grant.get('value')}",
                                    newlines=False)
            where = f"  {escape_controls(root, newlines=False)}" if everywhere else ""
            click.echo(f"{number:>3}  {grant.get('tool', '?'):<14} {shown}{where}")


@permissions.command("revoke")
@click.argument("number", type=click.IntRange(min=1), required=False)
@click.option("--all", "everything", is_flag=True, help="Forget every grant of every project.")
def permissions_revoke(number: int | None, everything: bool) -> None:
    """Forget grant NUMBER of this project (from `dsh permissions list`), all of this
    project's without NUMBER, or every project's with --all."""
    from dsh.tools.grants import revoke_grants

    if everything:
        if number is not None:
            raise click.UsageError("--all takes no NUMBER")
        gone = revoke_grants(None)
    else:
        gone = revoke_grants(".", number)
    warn(f"revoked {gone} grant(s)")
