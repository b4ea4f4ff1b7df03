"""What every ``dsh`` command shares: :class:`State` (``ctx.obj``: the ``--config`` path and
the app, built on first use) with :data:`pass_state` and :func:`pass_app` (public as
``dsh.pass_app``), and dsh's voice outside the answer —
:func:`warn` (``dsh: …`` lines on stderr, controls made visible on a terminal),
:class:`Failure` (a dsh error on its way out, with its exit code), the phrases for OS errors
(:func:`os_reason`, :func:`io_error_message`) and :func:`_dump` (a ``--json`` view on stdout).

Imports only click at import time: the root group (:mod:`dsh.cli.root`), ``dsh run``
(:mod:`dsh.cli.run_command`) and every command in :mod:`dsh.cli.commands` build on it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import click

if TYPE_CHECKING:
    from dsh.run.app import App


class State:
    """``ctx.obj`` of every command: the ``--config`` path and the app, built on first use.

    Plugin commands receive the app with :func:`pass_app` (``dsh.pass_app``).
    """

    def __init__(self, config_path: Path | None = None) -> None:
        self.config_path = config_path
        self._app: App | None = None
        self._commands: dict[str, tuple[str, click.Command]] | None = None
        self._warned: set[Any] = set()

    @property
    def app(self) -> App:
        if self._app is None:
            from dsh.run.app import App

            self._app = App.from_config(self.config_path)
            self.warn_plugin_errors()  # imports the plugins, as every command using the app does
        return self._app

    def warn_plugin_errors(self) -> None:
        """One ``dsh: warning:`` line on stderr per plugin that failed to load, once."""
        for rec in self.app.plugins:
            if rec.error and rec.name not in self._warned:
                self._warned.add(rec.name)
                warn(f"warning: plugin {rec.label} failed to load: {rec.error}")
        for note in self.app.notes:  # e.g. a plugin's agent the config overrides
            if ("note", note) not in self._warned:
                self._warned.add(("note", note))
                warn(f"note: {note}")

    def config_file(self) -> Path:
        from dsh.config.loader import default_config_path

        return self.config_path or default_config_path()

    def plugin_commands(self) -> dict[str, tuple[str, click.Command]]:
        """``{name: (plugin, command)}`` from every ``register_commands`` implementation."""
        if self._commands is None:
            from dsh.cli.root import LAZY_COMMANDS
            from dsh.cli.root import cli
            from dsh.core.errors import PluginError

            table: dict[str, tuple[str, click.Command]] = {}
            for impl in reversed(self.app.pm.hook.register_commands.get_hookimpls()):
                scratch = click.Group("dsh")
                try:
                    impl.function(*[scratch for _ in impl.argnames])
                except Exception as exc:
                    raise PluginError(f"plugin {impl.plugin_name} failed in register_commands: "
                                      f"{type(exc).__name__}: {exc}",
                                      plugin=impl.plugin_name, hook="register_commands") from exc
                for name, cmd in scratch.commands.items():
                    if name not in cli.commands and name not in LAZY_COMMANDS:
                        # built-in commands always win
                        table.setdefault(name, (impl.plugin_name, cmd))
            self._commands = table
        return self._commands


def _state(ctx: click.Context) -> State:
    root = ctx.find_root()
    if not isinstance(root.obj, State):
        root.obj = State(root.params.get("config"))
    return root.obj


pass_state = click.make_pass_decorator(State)


def pass_app(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a plugin's click command (``dsh.pass_app``) to receive the :class:`dsh.App`
    as its first argument, as ``click.pass_obj`` passes ``ctx.obj``::

        @dsh.hookimpl
        def register_commands(cli):
            @cli.command("notes")
            @dsh.pass_app
            def notes(app, limit):
                ...

    The app is built from the command line's ``--config`` on first use, once per
    invocation, and shared with every other command of it (the same object ``dsh run`` and
    ``dsh config validate`` use); a plugin that failed to load is reported on stderr then."""
    import functools

    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> Any:
        return fn(_state(click.get_current_context()).app, *args, **kwargs)

    return command


class Failure(click.ClickException):
    """A :class:`dsh.core.errors.DshError` on its way out: ``dsh: error: MESSAGE``, its exit
    code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # per instance, not per class

    def show(self, file: Any = None) -> None:
        warn(f"error: {self.message}")



def os_reason(exc: OSError) -> str:
    """An OS error as a short phrase: ``no space left on device``."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return reason[:1].lower() + reason[1:]


def io_error_message(exc: OSError) -> str:
    """``cannot write to standard output: no space left on device`` and the like."""
    reason = os_reason(exc)
    if exc.filename is None:
        from dsh.cli.streams import silence_stdout

        silence_stdout()  # the interpreter's last flush must not fail the same way again
        return f"cannot write to standard output: {reason}"
    return f"{reason}: {exc.filename}"


def warn(message: str) -> None:
    """``dsh: MESSAGE`` on stderr; on a terminal, controls in it (from a model, a tool, a
    ledger) are made visible. A terminal that hung up (SIGHUP) is not an error here. An
    error (``error: …``, ``task t1 (line 2): error: …``) is always one line (:func:`one_line`)."""
    if "error:" in message.partition("\n")[0]:
        from dsh.core.sanitize import one_line

        message = one_line(message)
    if sys.stderr is not None and sys.stderr.isatty():
        from dsh.cli.escape import escape_controls

        message = escape_controls(message)
    try:
        click.echo(f"dsh: {message}", err=True)
    except OSError:
        pass


def _dump(data: Any) -> None:
    """A ``--json`` view on stdout (``sessions list``, ``plugins``, …): indented JSON."""
    import json

    text = json.dumps(data, ensure_ascii=False, indent=2, default=str)
    if sys.stdout.isatty():  # C1 and bidi controls JSON leaves raw: \uXXXX on a terminal
        from dsh.cli.escape import escape_json_controls

        text = escape_json_controls(text)
    click.echo(text)
