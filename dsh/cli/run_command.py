"""``dsh run`` (docs/cli.md): one turn from the command line — the prompt from the argument
and stdin (:func:`read_prompt`), the agent and session from the options
(:mod:`dsh.cli.options`), the turn run and shown by :class:`dsh.cli.terminal.RunOutput`, and
the exit code of its outcome (:data:`EXIT_CODES`, :func:`_send`).

The command is registered on the root group by :mod:`dsh.cli.root`. Imports only click and
:mod:`dsh.cli` at import time: what the run needs is imported when it runs.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from dsh.cli.options import MODE_HELP
from dsh.cli.options import agent_and_session_options
from dsh.cli.options import agent_overrides
from dsh.cli.options import assemble_agent
from dsh.cli.options import keep_session_model
from dsh.cli.options import note_default_model
from dsh.cli.options import note_model_switch
from dsh.cli.options import note_unpriced
from dsh.cli.options import note_yes
from dsh.cli.options import parse_limits
from dsh.cli.options import session_to_resume
from dsh.cli.shared import State
from dsh.cli.shared import pass_state
from dsh.cli.shared import warn
from dsh.core import errors

#: Exit code of each turn outcome (docs/cli.md).
EXIT_CODES = {"completed": errors.EXIT_OK, "error": errors.EXIT_ERROR,
              "budget": errors.EXIT_LIMIT, "rejected": errors.EXIT_REJECTED,
              "stopped": errors.EXIT_INTERRUPTED, "aborted": errors.EXIT_INTERRUPTED}


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


def prompt_words(ctx: click.Context, param: Any, words: tuple[str, ...]) -> str | None:
    """PROMPT is one argument, except after a command: ``dsh run /NAME ARGS…`` takes the
    words after ``/NAME`` as its arguments, joined by spaces (as ``dsh run "/NAME ARGS…"``)."""
    if len(words) <= 1:
        return words[0] if words else None
    from dsh.run.commands import split_command

    if split_command(words[0]) is None:
        raise click.UsageError(
            f"PROMPT is one argument, got {len(words)} (starting {words[0]!r} {words[1]!r}): "
            "quote the prompt; unquoted words are taken only after a /NAME command")
    return " ".join(words)


@click.command()
@click.argument("prompt", nargs=-1, callback=prompt_words)
@agent_and_session_options
@click.option("--no-save", is_flag=True, help="Keep the session in memory only.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object with the result at the end.")
@click.option("--events", is_flag=True,
              help="Print JSON Lines while running: session, events, text deltas, result.")
@click.option("--stream/--no-stream", default=None,
              help="Print text as it arrives (default: when stdout is a terminal).")
@click.option("-q", "--quiet", is_flag=True,
              help="On a terminal, leave out the lines of the run's work on stderr (tool "
                   "calls, approvals, retries); the status line stays.")
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
@click.option("--no-tools", is_flag=True, help="Offer the model no tool at all (also -T '').")
@click.option("--mode", metavar="MODE", default=None, help=MODE_HELP)
@click.option("--yes", is_flag=True, help="Approve every tool call that would ask, in this run.")
@click.option("--attach", metavar="FILE|URL|-", multiple=True, expose_value=False,
              callback=lambda ctx, _, value: ctx.meta.__setitem__("dsh.attach", value),
              help="Attach an image (PNG, JPEG, GIF, WebP) or a PDF: a file, an http(s) URL "
                   "(downloaded once) or - for stdin (repeatable; docs/attachments.md).")
@click.option("-f", "--fragment", metavar="FILE|URL", multiple=True, expose_value=False,
              callback=lambda ctx, _, value: ctx.meta.__setitem__("dsh.fragments", value),
              help="Text context: a UTF-8 file or an http(s) URL, sent before the prompt in a "
                   "block headed by its name (repeatable).")
@click.option("--show-reasoning", is_flag=True, expose_value=False,
              callback=lambda ctx, _, value: ctx.meta.__setitem__("dsh.reasoning", value),
              help="Stream the model's reasoning (thinking) to stderr, dimmed, as it arrives; "
                   "never to stdout.")
@click.option("-u", "--usage", "show_usage", is_flag=True,
              help="Print one line on stderr at the end: the run's tokens and cost.")
@click.option("--schema", metavar="SCHEMA",
              help="JSON Schema the answer must match: a file, inline JSON, or llm's concise "
                   "'name, age int'. stdout is then exactly the JSON document.")
@pass_state
def run(state: State, prompt: str | None, model: str | None, system: str | None,
        agent: str | None, continue_: bool, any_dir: bool, session_id: str | None,
        no_save: bool,
        as_json: bool, events: bool, stream: bool | None, quiet: bool,
        max_steps: int | None,
        timeout: float | None, limits: tuple[str, ...], options: tuple[str, ...],
        tools: tuple[str, ...], no_tools: bool, mode: str | None, yes: bool,
        show_usage: bool, schema: str | None) -> None:
    """Run PROMPT as one turn and print the answer.

    PROMPT comes from the argument, from stdin, or both (stdin is then appended as a
    <stdin> block); -f fragments go before it. `dsh run /NAME ARGS...` runs a command
    without quotes. Exit codes: 0 completed, 1 error, 2 usage or config error, 3 limit
    reached, 4 rejected by a plugin, 130 interrupted, 143/129 ended by SIGTERM/SIGHUP.
    """
    machine = as_json or events
    if as_json and events:
        raise click.UsageError("--json and --events cannot be combined")
    if stream and machine:
        raise click.UsageError("--stream cannot be combined with --json or --events")
    if continue_ and session_id:
        raise click.UsageError("--continue and --session cannot be combined")
    if any_dir and not continue_:
        raise click.UsageError("--any-dir applies to -c/--continue")
    forking = click.get_current_context().meta.get("dsh.fork")
    if no_save and (continue_ or session_id or forking):
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
    overrides = agent_overrides(model, system, max_steps, options, mode)
    from dsh.cli.streams import Stdout
    from dsh.cli.terminal import RunOutput
    from dsh.core.errors import DshError

    output = RunOutput(Stdout(), events=events, as_json=as_json,
                       stream=False if output_schema is not None else stream, quiet=quiet)
    output.schema = output_schema
    if click.get_current_context().meta.get("dsh.reasoning"):
        output.show_reasoning()
    try:
        app = state.app
        chosen = "model" in overrides  # -m: it beats a command's model and the session's
        assembled, overrides = assemble_agent(app, agent, overrides, tools, no_tools,
                                              note=False)
        note_yes(yes, assembled)
        resume = session_to_resume(app, assembled, continue_, session_id, any_dir)
        assembled, overrides = keep_session_model(app, assembled, overrides, resume)
        note_default_model(app, assembled, overrides)
        text, assembled = expand_command(state, assembled, overrides, tools,
                                         prompt if prompt else text, text, chosen)
        note_unpriced(assembled, budget)
        sources = click.get_current_context().meta.get("dsh.fragments", ())
        loaded: list[Any] = []
        if sources:  # read (and download) before a session exists, like attachments
            from dsh.llm import fragments

            loaded = [fragments.load(f) for f in sources]
            text = fragments.prepend(loaded, text)
        if attach:  # read (and download) before a session exists: a bad one creates nothing
            from dsh.llm.attachments import load as load_attachment

            inputs = [load_attachment(a) for a in attach]
        session = app.open_session(assembled, resume, save=not no_save)
        note_model_switch()
        if loaded:  # the ledger keeps each once by hash, like attachments
            session.ledger.expect_fragments(tuple(loaded))
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
        code = _send(session, text, output, timeout=timeout, approve=yes, limits=budget,
                     show_usage=show_usage)
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


def expand_command(state: State, assembled: Any, overrides: dict[str, Any],
                   tools: tuple[str, ...], head: str, text: str,
                   model_chosen: bool | None = None) -> tuple[str, Any]:
    """A prompt starting with ``/NAME ARGS…`` expanded by the agent's plugins (the
    ``expand_command`` hook; stdin, when given, stays appended after the expansion), and the
    agent to run it: with the command's ``model`` unless ``-m`` chose one (``model_chosen``;
    default: ``overrides`` has a model), and its ``tools`` unless ``-T`` did. ``//…`` sends
    ``/…``; an unknown command is a usage error (exit 2)."""
    state.warn_plugin_errors()  # notes of plugins' agents, now that the plugins are loaded
    if not head.startswith("/"):
        return text, assembled  # the plain path imports nothing of commands
    from dsh.run import commands

    found = commands.split_command(head)
    if found is None:
        if head.startswith("//"):
            return commands.unescape(head) + text[len(head):], assembled
        return text, assembled
    name, arguments = found
    expansion = commands.expand(assembled.pm, assembled.handle, name, arguments)
    extra: dict[str, Any] = {}
    if model_chosen is None:
        model_chosen = "model" in overrides
    if expansion.model and not model_chosen:
        extra["model"] = expansion.model
    if expansion.tools is not None and not tools:
        extra["tools"] = list(expansion.tools)
    if extra:
        assembled, _ = assemble_agent(state.app, assembled.name, {**overrides, **extra}, ())
    return expansion.prompt + text[len(head):], assembled


def _send(session: Any, text: str, output: Any, *, timeout: float | None,
          approve: bool, limits: Any = None, show_usage: bool = False) -> int:
    """Run the turn, print the result, report on stderr (with ``show_usage``, the ``-u``
    line first); return the exit code."""
    for note in session.ledger.notes:
        warn(f"note: {note}")
    result = output.run(session, text, timeout=timeout, approve=approve, limits=limits)
    lost = getattr(session.ledger, "lost", None)
    if lost and result.outcome != "error":  # the ledger was deleted during the run
        import attrs

        result = attrs.evolve(result, outcome="error", reason=lost)
    output.finish(result, session.agent.name, session.agent.model_id)
    if show_usage:
        from dsh.run.costs import usage_line

        warn(usage_line(result.usage, getattr(result, "cost", None)))
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
