"""The ``dsh`` command line (docs/cli.md): the root group, its global options and the console
script; thin click commands over :class:`dsh.App`.

Start-up is a feature: this module imports only click, so ``dsh --help`` and ``dsh --version``
load no plugin and import no provider, pluggy, httpx or cattrs. The app is assembled lazily,
on first use by a command (:class:`dsh.cli.shared.State`). Plugin commands
(``register_commands``) are looked up only for a name that is not built in; ``dsh --help``
lists them only with ``DSH_HELP_PLUGINS=1`` (``dsh plugins`` always does).

This module holds the root group (:class:`DshGroup`, :func:`cli`), the global ``--config``
option and :func:`main`. ``dsh run`` is :mod:`dsh.cli.run_command` (registered here); the
helpers commands share are :mod:`dsh.cli.shared` and :mod:`dsh.cli.options`; every other
built-in command has a module of its own in :mod:`dsh.cli.commands`, imported only when that
command is asked for or listed (:data:`LAZY_COMMANDS`). Their names still resolve here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import click

from dsh._version import __version__
from dsh.cli.options import _utf8 as _utf8  # re-exported
from dsh.cli.options import agent_overrides as agent_overrides  # re-exported
from dsh.cli.options import assemble_agent as assemble_agent  # re-exported
from dsh.cli.options import latest_session as latest_session  # re-exported
from dsh.cli.options import note_default_model as note_default_model  # re-exported
from dsh.cli.options import parse_limits as parse_limits  # re-exported
from dsh.cli.options import parse_options as parse_options  # re-exported
from dsh.cli.options import resolve_session as resolve_session  # re-exported
from dsh.cli.options import session_to_resume as session_to_resume  # re-exported
from dsh.cli.run_command import EXIT_CODES as EXIT_CODES  # re-exported
from dsh.cli.run_command import _send as _send  # re-exported
from dsh.cli.run_command import read_prompt as read_prompt  # re-exported
from dsh.cli.run_command import run
from dsh.cli.shared import Failure
from dsh.cli.shared import State as State  # re-exported
from dsh.cli.shared import _dump as _dump  # re-exported
from dsh.cli.shared import _state
from dsh.cli.shared import io_error_message
from dsh.cli.shared import os_reason as os_reason  # re-exported
from dsh.cli.shared import pass_state as pass_state  # re-exported
from dsh.cli.shared import warn
from dsh.core import errors

#: Built-in commands defined in other modules (dsh/cli/commands/), imported only when asked for
#: by name or listed by ``dsh --help``: ``dsh run`` never imports them.
LAZY_COMMANDS: dict[str, str] = {
    "plugins": "dsh.cli.commands.inventory:plugins",
    "tools": "dsh.cli.commands.inventory:tools",
    "models": "dsh.cli.commands.inventory:models",
    "agents": "dsh.cli.commands.inventory:agents",
    "install": "dsh.cli.commands.install:install",
    "uninstall": "dsh.cli.commands.install:uninstall",
    "keys": "dsh.cli.commands.keys:keys",
    "sessions": "dsh.cli.commands.sessions:sessions",
    "config": "dsh.cli.commands.config:config",
    "chat": "dsh.cli.commands.chat:chat",
    "batch": "dsh.cli.commands.batch:batch",
    "sandbox": "dsh.cli.commands.sandbox:sandbox",
    "trust": "dsh.cli.commands.trust:trust",
    "permissions": "dsh.cli.commands.permissions:permissions",
    "replay": "dsh.cli.commands.replay:replay",
    "doctor": "dsh.cli.commands.doctor:doctor",
}

#: Other names that moved from this module to dsh/cli/commands/. They, and the commands above,
#: still resolve as ``dsh.cli.root.NAME`` (a plugin may have imported one from here), imported only
#: then: ``dsh run`` does not pay for them.
MOVED: dict[str, str] = {
    "newest": "dsh.cli.commands.sessions:newest",
}

if not TYPE_CHECKING:  # typed code imports them from their modules

    def __getattr__(name: str) -> Any:
        """``dsh.cli.root.sessions``, ``from dsh.cli.root import newest``: from their new
        modules."""
        target = LAZY_COMMANDS.get(name) or MOVED.get(name)
        if target is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        import importlib

        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)


class DshGroup(click.Group):
    """The root group: maps dsh errors to exit codes, quiet on a closed stdout, and looks up
    plugin commands only when a name is not built in."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is None and cmd_name in LAZY_COMMANDS:
            import importlib

            module, _, attr = LAZY_COMMANDS[cmd_name].partition(":")
            cmd = getattr(importlib.import_module(module), attr)
        if cmd is None:
            found = _state(ctx).plugin_commands().get(cmd_name)
            cmd = found[1] if found else None
        return cmd

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = sorted({*super().list_commands(ctx), *LAZY_COMMANDS})
        if os.environ.get("DSH_HELP_PLUGINS"):  # opt-in: plain `dsh --help` loads no plugin
            from dsh.core.errors import DshError

            try:
                names = sorted({*names, *_state(ctx).plugin_commands()})
            except DshError as exc:
                click.echo(f"dsh: warning: plugin commands not listed: {exc}", err=True)
        return names

    def invoke(self, ctx: click.Context) -> Any:
        import warnings

        from dsh.core.errors import DshError
        from dsh.core.errors import DshWarning

        try:
            with warnings.catch_warnings():
                # dsh's own warnings (a plugin's misspelt hook): one `dsh: warning:` line each
                warnings.simplefilter("always", DshWarning)
                show = warnings.showwarning

                def show_warning(message: Warning | str, category: type[Warning],
                                 *args: Any, **kwargs: Any) -> None:
                    if issubclass(category, DshWarning):
                        warn(f"warning: {message}")
                    else:
                        show(message, category, *args, **kwargs)

                warnings.showwarning = show_warning
                return super().invoke(ctx)
        except DshError as exc:
            from dsh.core.redact import redact

            raise Failure(redact(str(exc)), exc.exit_code) from None
        except KeyboardInterrupt:
            raise Failure("interrupted", 130) from None
        except BrokenPipeError:
            from dsh.cli.streams import silence_stdout

            silence_stdout()
            ctx.exit(0)
        except OSError as exc:  # stdout on a full disk (/dev/full), an unwritable file…
            raise Failure(io_error_message(exc), errors.EXIT_ERROR) from None


@click.group(cls=DshGroup)
@click.option("--config", type=click.Path(dir_okay=False, path_type=Path), is_eager=True,
              help="Config file (default: $DSH_CONFIG, else $XDG_CONFIG_HOME/dsh/config.toml).")
@click.version_option(__version__, "--version", prog_name="dsh",
                      message="%(prog)s %(version)s", help="Show the version and exit.")
@click.pass_context
def cli(ctx: click.Context, config: Path | None) -> None:
    """dsh: run LLM agents as a tree of pluggy plugins.

    Answers go to stdout, everything else to stderr. Plugin commands are listed by
    `dsh plugins` (and here with DSH_HELP_PLUGINS=1).
    """
    _state(ctx)


cli.add_command(run)  # dsh run (dsh/cli/run_command.py)


def main() -> None:
    """The ``dsh`` console script."""
    try:
        try:
            cli.main(prog_name="dsh")
        finally:
            sys.stdout.flush()  # a closed pipe surfaces here, not at interpreter exit
    except BrokenPipeError:
        from dsh.cli.streams import silence_stdout

        silence_stdout()
        sys.exit(0)
    except OSError as exc:  # the last flush of stdout failed (a full disk)
        from dsh.core.sanitize import one_line

        click.echo(f"dsh: error: {one_line(io_error_message(exc))}", err=True)
        sys.exit(errors.EXIT_ERROR)
