"""``dsh acp``: serve the Agent Client Protocol on stdin/stdout until the editor disconnects.

Imports only click at import time; the ACP SDK, asyncio and the server are imported when the
command runs (``dsh run`` and ``dsh --help`` never import them).
"""

from __future__ import annotations

from pathlib import Path

import click

#: How long a permission question waits for the editor's answer by default (seconds).
PERMISSION_TIMEOUT = 300.0
#: The longest JSON-RPC line read by default (bytes); a longer one is answered with an error.
MAX_LINE = 16 * 1024 * 1024


@click.command()
@click.option("--root", "roots", multiple=True, metavar="DIR",
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Also allow sessions whose cwd is DIR or below (repeatable; default: only "
                   "the directory dsh acp was started in, and below).")
@click.option("-a", "--agent", metavar="AGENT", default=None,
              help="The agent of the sessions (default: the config's agent).")
@click.option("-m", "--model", metavar="MODEL", default=None,
              help="The model of the sessions (default: the agent's; a loaded session "
                   "keeps the one it recorded).")
@click.option("--mode", metavar="MODE", default=None,
              help="The permission mode new sessions start in (default: the agent's; the "
                   "editor may switch it with session/set_mode).")
@click.option("--permission-timeout", type=click.FloatRange(min=0, min_open=True),
              default=PERMISSION_TIMEOUT, show_default=True, metavar="SECONDS",
              help="How long a permission question waits for the editor; no answer is a no.")
@click.option("--max-line", type=click.IntRange(min=1024), default=MAX_LINE,
              show_default=True, metavar="BYTES",
              help="The longest JSON-RPC message read; a longer one is answered with an error "
                   "and dropped.")
def acp(roots: tuple[Path, ...], agent: str | None, model: str | None, mode: str | None,
        permission_timeout: float, max_line: int) -> None:
    """Serve the Agent Client Protocol on stdin/stdout, for editors (dsh-acp).

    Zed: {"agent_servers": {"dsh": {"command": "dsh", "args": ["acp"]}}}. stdout carries
    only the protocol; dsh's messages go to stderr. Ends when the editor closes stdin.
    """
    import os

    if mode is not None:
        from dsh.host.runcontext import check_mode

        check_mode(mode)
    state = click.get_current_context().obj
    allowed = [os.path.realpath(os.getcwd()), *(os.path.realpath(r) for r in roots)]
    from dsh_acp.server import serve

    serve(state, allowed=allowed, agent=agent, model=model, mode=mode,
          permission_timeout=permission_timeout, max_line=max_line)
