"""dsh-acp: ``dsh acp``, dsh as an Agent Client Protocol agent (JSON-RPC over stdio).

Editors (Zed, JetBrains, Neovim) start ``dsh acp`` and drive dsh sessions through it:
``session/new`` (the workbench's workspace is the editor's ``cwd``), ``session/prompt`` (one
dsh turn, streamed as ``session/update`` notifications), ``session/cancel``, ``session/load``
(the history replayed from the ledger), ``session/list``, ``session/set_mode`` (dsh's
permission modes) and ``session/request_permission`` for the approval questions the mode
leaves open. See docs/editors.md.

Importing this module imports neither ``acp`` nor ``asyncio``: ``dsh run`` never pays for
them; :mod:`dsh_acp.commands` imports them when ``dsh acp`` runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsh.hookspecs import hookimpl

if TYPE_CHECKING:
    import click

__version__ = "0.1.0"
__all__ = ["__version__", "register_commands"]


@hookimpl
def register_commands(cli: click.Group) -> None:
    from dsh_acp.commands import acp

    cli.add_command(acp)
