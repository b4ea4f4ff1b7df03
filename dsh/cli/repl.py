"""``dsh chat``: an interactive session in the terminal (MISSION E5, B3; docs/cli.md).

Every message goes through the same :class:`~dsh.run.app.Session`, ledger and output as
``dsh run`` (one :class:`~dsh.cli.terminal.RunOutput` per turn: streaming, the status line,
Ctrl-C, SIGTERM), so a chat session can be continued by ``dsh run --session ID`` and the other
way round. What chat adds:

* **steering** — a line typed while a turn runs is put into the running session's inbox
  (:meth:`Session.steer`) and taken at the turn's next step boundary, after that step's tool
  results; a line starting with ``>`` is kept for after the turn instead (a follow-up);
* on a terminal, an input line at the bottom that the streamed output never writes into
  (prompt_toolkit, :mod:`dsh.cli.chat_input`), with a persistent history, completion of ``/``
  commands and ``@`` paths, ``\\`` line continuation, ``\"\"\"`` blocks, Alt-Enter for a
  newline, and pasted text kept as one message;
* a resumed chat (``-c``, ``--session``) starts with a recap of its last exchanges, read
  from the ledger (:mod:`dsh.cli.chat_recap`);
* ``/`` commands (:mod:`dsh.cli.chat_commands`), and commands that plugins add with the
  ``register_chat_commands`` hook;
* without a terminal on stdin: one message per line, answered in turn (scriptable).

This module is imported only by ``dsh chat``; ``dsh run`` never pays for it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.cli.chat_commands import BLOCK as BLOCK  # re-exported
from dsh.cli.chat_commands import BUILTIN_COMMANDS as BUILTIN_COMMANDS  # re-exported
from dsh.cli.chat_commands import FOLLOW_UP as FOLLOW_UP  # re-exported
from dsh.cli.chat_commands import ChatCommand as ChatCommand  # re-exported
from dsh.core import errors

if TYPE_CHECKING:
    from dsh.run.app import App
    from dsh.run.app import Session

PROMPT = "› "
MORE = "… "


def history_path() -> Path:
    """The prompt history: ``$DSH_HOME/chat_history``, else beside the sessions directory."""
    from dsh.ledger.store import default_data_dir

    return default_data_dir() / "chat_history"


class Chat:
    """One ``dsh chat``: the session, the agent overrides, the output of each turn."""

    def __init__(self, app: App, session: Session, *, agent: str | None,
                 overrides: dict[str, Any], approve: bool = False, limits: Any = None,
                 interactive: bool | None = None) -> None:
        self.app = app
        self.session = session
        self.agent_name = agent
        self.overrides = dict(overrides)
        self.approve = approve
        self.limits = limits
        self.interactive = sys.stdin.isatty() if interactive is None else interactive
        self.follow_ups: list[str] = []
        self.exit_code = 0
        self.done = False
        self.output: Any = None
        self.commands = self._commands()

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> int:
        """Read and answer messages until ``/exit``, end of input, or a terminating signal."""
        if not self.interactive:
            from dsh.cli.streams import Stdout

            self.stdout = Stdout()
            return self._loop()
        from dsh.cli.chat_input import ChatTerminal

        self.term = ChatTerminal(self, history_path())
        self.stdout = self.term.stdout
        with self.term.installed():  # what goes to stdout and stderr, above the prompt
            self.note(f"dsh chat · session {self.session.id} · agent {self.session.agent.name}"
                      f" · model {self.session.agent.model_id} · /help for commands, "
                      "Ctrl-D to exit")
            if self.session.ledger.projection.turn > 0:
                from dsh.cli.chat_recap import recap

                for line in recap(self.app.store, self.session.id):
                    self.note(line)
            return self._loop()

    def _loop(self) -> int:
        try:
            while not self.done:
                if self.session.pending:  # steered too late for the last turn: answer it now
                    self.turn("")
                    continue
                if self.follow_ups:
                    self.turn(self.follow_ups.pop(0))
                    continue
                text = self.read_message()
                if text is None:
                    break
                self.handle(text)
        finally:
            self.note(f"session {self.session.id} (continue it with: dsh chat -c, or "
                      f"dsh run --session {self.session.id} …)")
        return self.exit_code

    def handle(self, text: str) -> None:
        """A message, or a ``/`` command."""
        stripped = text.strip()
        if not stripped:
            return
        if stripped.startswith("/") and not stripped.startswith("//"):
            self.command(stripped)
            return
        if stripped.startswith("//"):  # "//etc" sends "/etc"
            text = text.replace("//", "/", 1)
        self.turn(text)

    def command(self, line: str, during_turn: bool = False) -> None:
        name, _, arg = line[1:].partition(" ")
        cmd = self.commands.get(name)
        if cmd is None:
            if self.prompt_command(line, during_turn):
                return
            from dsh.core.errors import unknown_name
            from dsh.run.commands import known_commands

            agent = self.session.agent
            known = [*self.commands, *known_commands(agent.pm, agent.handle)]
            self.note("dsh: " + unknown_name("command", "/" + name, ["/" + c for c in known],
                                             "known"))
            return
        if during_turn and not cmd.during_turn:
            self.note(f"dsh: /{name} waits for the turn to end; type it then")
            return
        try:
            shown = cmd.fn(self, arg.strip())
        except errors.DshError as exc:
            self.note(f"dsh: /{name}: {exc}")
            return
        except Exception as exc:  # a plugin's command must not end the chat
            self.note(f"dsh: /{name} ({cmd.plugin}) failed: {type(exc).__name__}: {exc}")
            return
        if shown:
            self.print_text(shown if shown.endswith("\n") else shown + "\n")

    def prompt_command(self, line: str, during_turn: bool) -> bool:
        """``/NAME ARGS…`` that a plugin expands (``expand_command``): the expansion is sent
        as the message (and recorded as it). True when a plugin knew the name."""
        from dsh.run.commands import expand
        from dsh.run.commands import split_command

        found = split_command(line)
        agent = self.session.agent
        if found is None:
            return False
        if during_turn:  # expanding may run a command's shell lines: not while a turn runs
            from dsh.run.commands import known_commands

            if found[0] not in known_commands(agent.pm, agent.handle):
                return False
            self.note(f"dsh: /{found[0]} waits for the turn to end; type it then")
            return True
        try:
            expansion = expand(agent.pm, agent.handle, *found)
        except errors.UsageError:
            return False
        except errors.DshError as exc:
            self.note(f"dsh: /{found[0]}: {exc}")
            return True
        if expansion.model or expansion.tools is not None:
            self.note(f"dsh: /{found[0]}: its model and tools apply in dsh run only; here "
                      "the chat's agent answers (/model switches it)")
        self.turn(expansion.prompt)
        return True

    def turn(self, text: str) -> None:
        """One turn, exactly as ``dsh run`` runs it, with typeahead while it runs."""
        from dsh.cli.terminal import RunOutput

        output = RunOutput(self.stdout, stream=True if self.interactive else None)
        if self.interactive:
            output._handlers.append(self.show_tool_event)
        self.output = output
        if self.interactive:  # typing goes on below the output, and steers the turn
            prefill, self._prefill = self._prefill, ""
            self.term.begin_turn(output, self.typed_during_turn, prefill)
        try:
            result = output.run(self.session, text, approve=self.approve, limits=self.limits)
        finally:
            if self.interactive:
                self._prefill = self.term.end_turn()
            self.output = None
        lost = getattr(self.session.ledger, "lost", None)
        if lost and result.outcome != "error":
            result = attrs.evolve(result, outcome="error", reason=lost)
        output.finish(result, self.session.agent.name, self.session.agent.model_id)
        from dsh.cli.run_command import EXIT_CODES

        code = 0
        if output.terminated:
            code = 128 + output.terminated
            self.done = True
        elif result.outcome == "error":
            code = getattr(result.error, "exit_code", errors.EXIT_ERROR)
            from dsh.core.sanitize import one_line

            self.note(f"dsh: error: {one_line(result.reason)}")
        elif output.interrupts or result.outcome in ("stopped", "aborted"):
            code = errors.EXIT_INTERRUPTED
            self.note(f"dsh: {result.outcome}")
        elif result.outcome != "completed":
            code = EXIT_CODES.get(result.outcome, errors.EXIT_ERROR)
            self.note(f"dsh: {result.outcome}: {result.reason}")
        if output.out.closed:
            self.done = True
        if code and not self.exit_code and not self.interactive:
            self.exit_code = code  # a script learns that something failed
        if output.terminated:
            self.exit_code = code

    def show_tool_event(self, event: Any) -> None:
        """One line per tool call and result, as they happen (in full: ``sessions show``)."""
        kind = getattr(event, "type", "")
        if kind == "tool/call":
            import json

            from dsh.cli.escape import one_line

            args = json.dumps(dict(event.arguments), ensure_ascii=False, default=str)
            self.note(f"  → {event.name} {one_line(args, 100)}")
        elif kind == "tool/result":
            took = f", {event.duration_ms / 1000:.1f}s" if event.duration_ms else ""
            first = event.output.strip().splitlines()[0] if event.output.strip() else ""
            from dsh.cli.escape import one_line

            self.note(f"  ← {event.name}: {event.status}{took} · {one_line(first, 80)}")
            if getattr(event, "changes", ()):
                self.show_changes(event.changes)

    def show_changes(self, changes: Any) -> None:
        """The recorded diffs of a tool result, coloured on a terminal (at most 20 lines
        each; ``dsh sessions show --full`` has them whole)."""
        import click

        from dsh.cli.diffs import diff_lines
        from dsh.cli.escape import escape_controls

        color = sys.stderr.isatty()

        def style(text: str, **kw: Any) -> str:
            text = escape_controls(text)  # the diff is the workspace's text: no controls
            return click.style(text, **kw) if color else text

        for line in diff_lines(changes, style, limit=20, indent="    "):
            if self.output is not None:
                self.output.note(line, styled=True)
            else:
                click.echo(line, err=True)

    def typed_during_turn(self, line: str) -> None:
        """A line typed while a turn runs: steer it, keep it for later, or a command."""
        text = line.strip()
        if not text:
            return
        if text.startswith(FOLLOW_UP):
            self.follow_ups.append(text[len(FOLLOW_UP):].strip())
            self.note(f"dsh: queued for after this turn ({len(self.follow_ups)} waiting)")
            return
        if text.startswith("/") and not text.startswith("//"):
            self.command(text, during_turn=True)
            return
        if text.startswith("//"):
            text = text[1:]
        if self.session.steer(text):
            self.note("dsh: queued: the agent takes it after the current step")
        else:
            self.note("dsh: queued: answered when this turn ends")

    # -- input ---------------------------------------------------------------------------------

    def read_message(self) -> str | None:
        """The next message (``None`` at end of input). Interactive: a line with editing
        and history; ``\\`` at the end continues it, ``\"\"\"`` opens a block; pasted lines
        arriving together are one message. Otherwise: one line of stdin."""
        if not self.interactive:
            line = sys.stdin.readline()
            if not line:
                return None
            return line.rstrip("\n")
        while True:
            try:
                first = self._input(PROMPT)
            except KeyboardInterrupt:  # Ctrl-C at the prompt clears the line
                self.print_text("\n")
                continue
            except EOFError:  # Ctrl-D at an empty prompt
                self.print_text("\n")
                return None
            break
        lines = [first]
        if first.strip() == BLOCK:
            lines = []
            while True:
                try:
                    nxt = self._input(MORE)
                except (EOFError, KeyboardInterrupt):
                    break
                if nxt.strip() == BLOCK:
                    break
                lines.append(nxt)
            return "\n".join(lines)
        while lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1]
            try:
                lines.append(self._input(MORE))
            except (EOFError, KeyboardInterrupt):
                break
        return "\n".join(lines)

    _prefill = ""
    term: Any = None

    def _input(self, prompt: str) -> str:
        prefill, self._prefill = self._prefill, ""
        return str(self.term.read(prompt, default=prefill))

    # -- output ----------------------------------------------------------------------------

    def note(self, message: str) -> None:
        """A line on stderr (through the running turn's status line, if any), with secrets
        redacted (an error from a provider or a plugin command may echo one)."""
        from dsh.core.redact import redact

        message = redact(message)
        if self.output is not None:
            self.output.note(message)
            return
        import click

        from dsh.cli.escape import escape_controls

        click.echo(escape_controls(message) if sys.stderr.isatty() else message, err=True)

    def print_text(self, text: str) -> None:
        from dsh.cli.escape import escape_controls

        self.stdout.write(escape_controls(text) if sys.stdout.isatty() else text)

    # -- commands --------------------------------------------------------------------------

    def set_agent(self, **overrides: Any) -> None:
        """Switch the session to the agent with these overrides (recorded on the next
        ``turn/start``, as every change of model, system prompt or tools is)."""
        merged = {**self.overrides, **overrides}
        agent = self.app.agent(self.agent_name, **merged)
        agent.model.provider_tools(agent.tool_specs)  # fails now if the model cannot be built
        self.overrides = merged
        self.session.agent = agent

    def _commands(self) -> dict[str, ChatCommand]:
        table = {c.name: c for c in BUILTIN_COMMANDS}
        pm = self.session.agent.pm
        for impl in pm.hook.register_chat_commands.get_hookimpls():
            plugin = impl.plugin_name

            def register(name: str, fn: Callable[[Chat, str], str | None], help: str = "",
                         during_turn: bool = False, _plugin: str = plugin) -> None:
                if name in table:
                    raise errors.PluginError(
                        f"chat command /{name} registered twice: by {table[name].plugin} and "
                        f"{_plugin}", plugin=_plugin, hook="register_chat_commands")
                table[name] = ChatCommand(name, fn, help, _plugin, during_turn)

            from dsh.host.manager import call_impl

            call_impl(impl, "register_chat_commands", register=register)
        return table
