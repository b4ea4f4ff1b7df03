"""The ``dsh`` command line (docs/cli.md): thin click commands over :class:`dsh.App`.

Start-up is a feature: this module imports only click, so ``dsh --help`` and ``dsh --version``
load no plugin and import no provider, pluggy, httpx or cattrs. The app is assembled lazily,
on first use by a command (:class:`State`). Plugin commands (``register_commands``) are looked
up only for a name that is not built in; ``dsh --help`` lists them only with
``DSH_HELP_PLUGINS=1`` (``dsh plugins`` always does).

This module holds the root group, the global options, the helpers several commands share and
``dsh run``; every other built-in command has a module of its own in :mod:`dsh.commands`,
imported only when that command is asked for or listed (:data:`LAZY_COMMANDS`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import click

from dsh._version import __version__
from dsh.core import errors

if TYPE_CHECKING:
    from dsh.run.app import App

#: Exit code of each turn outcome (docs/cli.md).
EXIT_CODES = {"completed": errors.EXIT_OK, "error": errors.EXIT_ERROR,
              "budget": errors.EXIT_LIMIT, "rejected": errors.EXIT_REJECTED,
              "stopped": errors.EXIT_INTERRUPTED, "aborted": errors.EXIT_INTERRUPTED}


class State:
    """``ctx.obj`` of every command: the ``--config`` path and the app, built on first use.

    Plugin commands reach the app as ``click.get_current_context().obj.app``.
    """

    def __init__(self, config_path: Path | None = None) -> None:
        self.config_path = config_path
        self._app: App | None = None
        self._commands: dict[str, tuple[str, click.Command]] | None = None
        self._warned: set[str] = set()

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

    def config_file(self) -> Path:
        from dsh.config.loader import default_config_path

        return self.config_path or default_config_path()

    def plugin_commands(self) -> dict[str, tuple[str, click.Command]]:
        """``{name: (plugin, command)}`` from every ``register_commands`` implementation."""
        if self._commands is None:
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


class Failure(click.ClickException):
    """A :class:`dsh.core.errors.DshError` on its way out: ``dsh: error: MESSAGE``, its exit
    code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # per instance, not per class

    def show(self, file: Any = None) -> None:
        warn(f"error: {self.message}")


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
            from dsh.cli.terminal import silence_stdout

            silence_stdout()
            ctx.exit(0)
        except OSError as exc:  # stdout on a full disk (/dev/full), an unwritable file…
            raise Failure(io_error_message(exc), errors.EXIT_ERROR) from None


def os_reason(exc: OSError) -> str:
    """An OS error as a short phrase: ``no space left on device``."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return reason[:1].lower() + reason[1:]


def io_error_message(exc: OSError) -> str:
    """``cannot write to standard output: no space left on device`` and the like."""
    reason = os_reason(exc)
    if exc.filename is None:
        from dsh.cli.terminal import silence_stdout

        silence_stdout()  # the interpreter's last flush must not fail the same way again
        return f"cannot write to standard output: {reason}"
    return f"{reason}: {exc.filename}"


def warn(message: str) -> None:
    """``dsh: MESSAGE`` on stderr; on a terminal, controls in it (from a model, a tool, a
    ledger) are made visible. A terminal that hung up (SIGHUP) is not an error here."""
    if sys.stderr is not None and sys.stderr.isatty():
        from dsh.cli.render import escape_controls

        message = escape_controls(message)
    try:
        click.echo(f"dsh: {message}", err=True)
    except OSError:
        pass


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


def main() -> None:
    """The ``dsh`` console script."""
    try:
        try:
            cli.main(prog_name="dsh")
        finally:
            sys.stdout.flush()  # a closed pipe surfaces here, not at interpreter exit
    except BrokenPipeError:
        from dsh.cli.terminal import silence_stdout

        silence_stdout()
        sys.exit(0)
    except OSError as exc:  # the last flush of stdout failed (a full disk)
        click.echo(f"dsh: error: {io_error_message(exc)}", err=True)
        sys.exit(errors.EXIT_ERROR)


# --------------------------------------------------------------------------------------------
# dsh run
# --------------------------------------------------------------------------------------------


def read_prompt(prompt: str | None) -> str:
    """The argument, stdin (when it is not a terminal), or both: stdin then becomes a block
    ``<stdin>…</stdin>`` after the argument, separated by a blank line (docs/cli.md)."""
    data = ""
    stdin = sys.stdin
    if stdin is not None and not stdin.isatty():
        buf = getattr(stdin, "buffer", None)
        data = buf.read().decode("utf-8", "replace") if buf is not None else stdin.read()
        data = data.rstrip("\n") if data.strip() else ""
    if prompt and data:
        return f"{prompt}\n\n<stdin>\n{data}\n</stdin>"
    if not (prompt or data):
        raise click.UsageError("no prompt: give PROMPT or pipe text on stdin")
    return prompt or data


@cli.command()
@click.argument("prompt", required=False)
@click.option("-m", "--model", help="Model id: echo, scripted:FILE, openai:gpt-4o-mini, …")
@click.option("-s", "--system", help="System prompt (replaces the agent's own).")
@click.option("-a", "--agent", help="Agent from the config (default: the config's `agent`).")
@click.option("-c", "--continue", "continue_", is_flag=True,
              help="Continue the agent's latest session.")
@click.option("--session", "session_id", metavar="ID", help="Resume session ID.")
@click.option("--no-save", is_flag=True, help="Keep the session in memory only.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object with the result at the end.")
@click.option("--events", is_flag=True,
              help="Print JSON Lines while running: session, events, text deltas, result.")
@click.option("--stream/--no-stream", default=None,
              help="Print text as it arrives (default: when stdout is a terminal).")
@click.option("--max-steps", type=click.IntRange(min=1), help="Steps allowed in this turn.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Wall-clock limit of the run, in seconds.")
@click.option("-L", "--limit", "limits", multiple=True, metavar="KEY=VALUE",
              help="Budget limit of this run (repeatable): requests, steps, tool_calls, "
                   "input_tokens, output_tokens, total_tokens, cost, seconds.")
@click.option("-o", "--option", "options", multiple=True, metavar="KEY=VALUE",
              help="Model option, e.g. -o temperature=0.2 (repeatable).")
@click.option("-T", "--tool", "tools", multiple=True, metavar="NAME",
              help="Allow only this tool (repeatable, or comma-separated).")
@click.option("--yes", is_flag=True, help="Approve tool calls that need approval.")
@click.option("--attach", metavar="FILE|URL|-", multiple=True, expose_value=False,
              callback=lambda ctx, _, value: ctx.meta.__setitem__("dsh.attach", value),
              help="Attach an image (PNG, JPEG, GIF, WebP) or a PDF: a file, an http(s) URL "
                   "(downloaded once) or - for stdin (repeatable; docs/attachments.md).")
@click.option("--show-reasoning", is_flag=True, expose_value=False,
              callback=lambda ctx, _, value: ctx.meta.__setitem__("dsh.reasoning", value),
              help="Stream the model's reasoning (thinking) to stderr, dimmed, as it arrives; "
                   "never to stdout.")
@click.option("--schema", metavar="SCHEMA",
              help="JSON Schema the answer must match: a file, inline JSON, or llm's concise "
                   "'name, age int'. stdout is then exactly the JSON document.")
@pass_state
def run(state: State, prompt: str | None, model: str | None, system: str | None,
        agent: str | None, continue_: bool, session_id: str | None, no_save: bool,
        as_json: bool, events: bool, stream: bool | None, max_steps: int | None,
        timeout: float | None, limits: tuple[str, ...], options: tuple[str, ...],
        tools: tuple[str, ...], yes: bool, schema: str | None) -> None:
    """Run PROMPT as one turn and print the answer.

    PROMPT comes from the argument, from stdin, or both (stdin is then appended as a
    <stdin> block). Exit codes: 0 completed, 1 error, 2 usage or config error, 3 limit
    reached, 4 rejected by a plugin, 130 interrupted, 143/129 ended by SIGTERM/SIGHUP.
    """
    machine = as_json or events
    if as_json and events:
        raise click.UsageError("--json and --events cannot be combined")
    if stream and machine:
        raise click.UsageError("--stream cannot be combined with --json or --events")
    if continue_ and session_id:
        raise click.UsageError("--continue and --session cannot be combined")
    if no_save and (continue_ or session_id):
        raise click.UsageError("--no-save cannot resume a session")
    if schema is not None and stream:
        raise click.UsageError("--stream cannot be combined with --schema (stdout is the "
                               "JSON document, printed once it is checked)")
    output_schema = None
    if schema is not None:
        from dsh.llm.schema import load as load_schema

        output_schema = load_schema(schema)  # a bad schema is a usage error, before any I/O
    budget = parse_limits(limits)
    attach: tuple[str, ...] = click.get_current_context().meta.get("dsh.attach", ())
    if "-" in attach:  # stdin is the attachment: the prompt is the argument alone
        if attach.count("-") > 1 or not prompt:
            raise click.UsageError("--attach - reads one attachment from stdin: give it once, "
                                   "and give PROMPT as an argument")
        text = prompt
    else:
        text = read_prompt(prompt)  # as given: its user/message records what was sanitised
    overrides = agent_overrides(model, system, max_steps, options)
    from dsh.cli.terminal import RunOutput
    from dsh.cli.terminal import Stdout
    from dsh.core.errors import DshError

    output = RunOutput(Stdout(), events=events, as_json=as_json,
                       stream=False if output_schema is not None else stream)
    output.schema = output_schema
    if click.get_current_context().meta.get("dsh.reasoning"):
        output.show_reasoning()
    try:
        app = state.app
        assembled, overrides = assemble_agent(app, agent, overrides, tools)
        resume = session_to_resume(app, assembled, continue_, session_id)
        if attach:  # read (and download) before a session exists: a bad one creates nothing
            from dsh.llm.attachments import load as load_attachment

            inputs = [load_attachment(a) for a in attach]
        session = app.open_session(assembled, resume, save=not no_save)
        try:
            if attach:
                session.attach(*inputs)
            session.check_attachments()  # a resumed session's, for this model
        except BaseException:
            session.close()
            raise
    except DshError as exc:
        from dsh.core.redact import redact

        output.fail(redact(str(exc)))
        raise
    with session:
        code = _send(session, text, output, timeout=timeout, approve=yes, limits=budget)
    if output.interrupts >= 2 or output.terminated:
        # Aborted (second Ctrl-C, SIGTERM, SIGHUP): the ledger is closed and consistent.
        # Tools still running in worker threads would be joined at interpreter exit; the
        # user asked to stop *now*.
        for out in (sys.stdout, sys.stderr):
            try:
                out.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    click.get_current_context().exit(code)


def _send(session: Any, text: str, output: Any, *, timeout: float | None,
          approve: bool, limits: Any = None) -> int:
    """Run the turn, print the result, report on stderr; return the exit code."""
    for note in session.ledger.notes:
        warn(f"note: {note}")
    result = output.run(session, text, timeout=timeout, approve=approve, limits=limits)
    lost = getattr(session.ledger, "lost", None)
    if lost and result.outcome != "error":  # the ledger was deleted during the run
        import attrs

        result = attrs.evolve(result, outcome="error", reason=lost)
    output.finish(result, session.agent.name, session.agent.model_id)
    if output.out.error:  # stdout failed (a full disk): the turn is in the ledger
        warn(f"error: {output.out.error}; the answer is in session {session.id}")
        return errors.EXIT_ERROR
    if output.out.closed:
        return 0  # the reader has what it wanted: end quietly
    code = EXIT_CODES.get(result.outcome, 1)
    if output.terminated:
        import signal

        code = 128 + output.terminated  # errors.EXIT_SIGTERM, errors.EXIT_SIGHUP
        warn(f"terminated by {signal.Signals(output.terminated).name} ({result.outcome}); "
             f"session {session.id}")
    elif result.outcome == "error":
        code = getattr(result.error, "exit_code", 1)
        warn(f"error: {result.reason}")
    elif output.timed_out:
        code = 3
        warn(f"time limit reached ({timeout:g}s); session {session.id}")
    elif output.interrupts or result.outcome in ("stopped", "aborted"):
        code = 130
        warn(f"interrupted ({result.outcome}); session {session.id}")
    elif result.outcome != "completed":
        warn(f"{result.outcome}: {result.reason}; session {session.id}")
    return code


# --------------------------------------------------------------------------------------------
# Helpers shared by run and the commands in dsh/cli/commands/ (which import them from here)
# --------------------------------------------------------------------------------------------


def parse_limits(pairs: tuple[str, ...]) -> Any:
    """``-L requests=5 -L cost=0.1`` → :class:`dsh.host.runcontext.Limits` (or None). Values
    follow the same rule as ``[limits]`` in the config (:func:`dsh.config.loader.check_limit`)."""
    if not pairs:
        return None
    from dsh.config.edit import parse_value
    from dsh.config.loader import check_limit
    from dsh.core.errors import UsageError
    from dsh.host.runcontext import Limits

    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = (part.strip() for part in pair.partition("="))
        if not sep:
            raise UsageError(f"--limit: expected KEY=VALUE, got {pair!r}")
        value = parse_value(raw)
        if isinstance(value, str):  # not TOML (".5"), or a word
            try:
                value = float(raw)
            except ValueError:
                pass
        try:
            values[key] = check_limit(key, value)
        except ValueError as exc:
            raise UsageError(f"--limit {key}: {exc}" if str(exc).startswith("expected") else
                             f"--limit: {exc}") from None
    return Limits(**values)


def _utf8(value: Any, option: str) -> Any:
    """``value`` with bytes that were not UTF-8 (Python hands them over as lone surrogates)
    replaced by U+FFFD, said on stderr. Cleaned here, where it is parsed, because the
    turn/start record and the request the transport checks against it must agree."""
    if value is None:
        return None
    from dsh.core.sanitize import clean_value

    cleaned, replaced = clean_value(value)
    if replaced:
        warn(f"warning: {option}: replaced {replaced} byte(s) that are not UTF-8 with U+FFFD")
    return cleaned


def parse_options(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``-o temperature=0.2`` → ``{"temperature": 0.2}``: each value parsed as TOML when it is
    one. A value JSON cannot carry (a TOML date) is refused here, before any session exists."""
    if not pairs:
        return {}
    from dsh.config.edit import parse_value
    from dsh.config.loader import options_error
    from dsh.core.errors import UsageError

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"-o: expected KEY=VALUE, got {pair!r}")
        value = parse_value(raw)
        problem = options_error(value, key.strip())
        if problem:
            raise UsageError(f"-o {problem} (quote it to pass text: -o '{key.strip()}=\"…\"')")
        out[key.strip()] = value
    return out


def agent_overrides(model: str | None, system: str | None, max_steps: int | None,
                    options: tuple[str, ...]) -> dict[str, Any]:
    """The agent overrides of ``dsh run`` and ``dsh chat`` (``-m -s --max-steps -o``)."""
    overrides: dict[str, Any] = {"model": model, "system": _utf8(system, "-s"),
                                 "max_steps": max_steps,
                                 "options": _utf8(parse_options(options) or None, "-o")}
    return {k: v for k, v in overrides.items() if v is not None}


def assemble_agent(app: App, agent: str | None, overrides: dict[str, Any],
                   tools: tuple[str, ...]) -> tuple[Any, dict[str, Any]]:
    """The agent with ``overrides`` and the ``-T`` allow list (an unknown tool is a usage
    error naming the available ones); says so when the offline default model answers."""
    allow = [t.strip() for item in tools for t in item.split(",") if t.strip()]
    overrides = dict(overrides)
    if allow:
        known = app.agent(agent, **overrides).tools
        for name in allow:
            if name not in known:
                from dsh.core.errors import UsageError
                from dsh.core.errors import unknown_name

                raise UsageError("--tool: " + unknown_name("tool", name, known, "available"))
        overrides["tools"] = allow
    assembled = app.agent(agent, **overrides)
    note_default_model(app, assembled, overrides)
    return assembled, overrides


def session_to_resume(app: App, agent: Any, continue_: bool, session_id: str | None) -> str | None:
    """``-c`` (the agent's latest session, with a note when there is none) or ``--session``."""
    if continue_:
        resume = latest_session(app, agent.name)
        if resume is None:
            warn(f"no session of agent {agent.name} to continue; starting a new one")
        return resume
    return resolve_session(app, session_id) if session_id else None


def note_default_model(app: App, agent: Any, overrides: dict[str, Any]) -> None:
    """Say so when nothing chose a model and the offline ``echo`` one answers."""
    if ("model" in overrides or app.config.agent_config(agent.name).model
            or not app.default_model.fallback):
        return
    warn("note: no model configured, so the offline echo model answers (it repeats the "
         "prompt). Choose one with `dsh config set model openai:gpt-4o-mini` (and set "
         "OPENAI_API_KEY), or pass -m MODEL; `dsh models` lists them")


def latest_session(app: App, agent: str | None = None) -> str | None:
    """The newest session (of ``agent``) that is not a sub-agent's; sessions that cannot be
    read (or are empty) are passed over."""
    for info in app.store.sessions():
        if (agent is None or info.agent == agent) and not info.parent:
            return str(info.id)
    return None


def resolve_session(app: App, text: str) -> str:
    """A session id from ``text``: an id, a unique prefix of one, or ``latest``
    (:func:`dsh.ledger.reader.resolve`)."""
    from dsh.ledger.reader import resolve

    return resolve(app.store, text)


def _dump(data: Any) -> None:
    """A ``--json`` view on stdout (``sessions list``, ``plugins``, …): indented JSON."""
    import json

    text = json.dumps(data, ensure_ascii=False, indent=2, default=str)
    if sys.stdout.isatty():  # C1 and bidi controls JSON leaves raw: \uXXXX on a terminal
        from dsh.cli.render import escape_json_controls

        text = escape_json_controls(text)
    click.echo(text)
