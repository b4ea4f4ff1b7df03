"""``dsh hooks list`` and ``dsh hooks test``."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from dsh_hooks.config import EVENTS


def _settings(agent: str | None, review: bool = False) -> tuple[Any, Any]:
    """The agent's hooks; ``review`` (``list``): a project file not trusted is not asked
    about, its hooks are listed as ignored with how to approve it."""
    from dsh_hooks import config
    from dsh_hooks.engine import _where

    app = click.get_current_context().find_root().obj.app
    info = app.agent(agent).info
    workspace = info.plugin_settings("shell").get("workspace")
    return config.load(info.plugin_settings("hooks"), _where(info), workspace,
                       review=review), workspace


def _line(text: str) -> str:
    from dsh.cli.escape import escape_controls

    return escape_controls(text, newlines=False) if sys.stdout.isatty() else text


@click.group()
def hooks() -> None:
    """Command hooks in Claude Code's protocol (dsh-hooks)."""


@hooks.command("list")
@click.option("--agent", help="The agent whose hooks to list (default: the config's agent).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per hook.")
def list_hooks(agent: str | None, as_json: bool) -> None:
    """Every configured hook: event, matcher, command and the file it comes from.

    A project file's hooks that are not trusted (or changed since) are listed as ignored,
    with the ``dsh trust approve`` that would let them run; nothing is asked."""
    settings, _ = _settings(agent, review=True)
    for h in settings.hooks:
        if as_json:
            click.echo(json.dumps({"event": h.event, "matcher": h.matcher,
                                   "command": h.command, "timeout": h.timeout,
                                   "source": h.source, "ignored": h.ignored or None,
                                   "project": h.from_project,
                                   "sandbox": h.policy.describe() if h.policy is not None
                                   else "off"}))
            continue
        state = f"  (ignored: {h.ignored})" if h.ignored else ""
        click.echo(_line(f"{h.event}\t{h.matcher or '*'}\t{h.command}\t{h.source}{state}"))
    if not as_json:
        for path in settings.missing:
            click.echo(_line(f"# not found: {path}"), err=True)
        if not settings.hooks:
            click.echo("# no hooks configured", err=True)


@hooks.command("test")
@click.argument("event", type=click.Choice(EVENTS))
@click.option("--tool", default="Bash", show_default=True,
              help="The tool's name: dsh's (run_command) or the protocol's (Bash).")
@click.option("--input", "input_json", default="{}",
              help="JSON: the tool's arguments for PreToolUse/PostToolUse (dsh's or the "
                   "protocol's names, as --tool), else the event's own fields "
                   "(e.g. {\"prompt\": \"…\"}).")
@click.option("--agent", help="The agent whose hooks to run (default: the config's agent).")
def test_hooks(event: str, tool: str, input_json: str, agent: str | None) -> None:
    """Run the hooks of EVENT that match on a sample input and print their decisions.

    One line per hook: ok, block or error, then what it answered. Exit status 2 when a hook
    blocked (exit 2, or a JSON answer a run reads as a block: ``permissionDecision: deny``,
    ``decision: block``), else 0.
    """
    from dsh_hooks.engine import Engine

    try:
        data = json.loads(input_json)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--input") from None
    if not isinstance(data, dict):
        raise click.BadParameter("expected a JSON object", param_hint="--input")
    settings, workspace = _settings(agent)
    eng = Engine(settings, None, workspace=workspace or os.getcwd())
    names: tuple[str, ...] = ()
    fields: dict[str, Any] = dict(data)
    if event in ("PreToolUse", "PostToolUse"):
        name, shown_input = eng.present(tool, data)
        fields = {"tool_name": name, "tool_input": shown_input, "tool_use_id": "test"}
        if event == "PostToolUse":
            fields["tool_response"] = {"output": "", "status": "ok", "success": True}
        names = (name, tool)
    elif event in ("PreCompact", "SessionStart"):
        names = (str(data.get("trigger") or data.get("source") or ""),)
    if event == "SessionStart":
        from dsh_hooks.events import session_start

        answers = session_start(eng, names[0] or "startup")
        for name, value in eng.session_env.items():
            click.echo(_line(f"# CLAUDE_ENV_FILE sets {name}={value}"), err=True)
    else:
        answers = eng.fire(event, fields, *names)
    if not answers:
        click.echo(f"no {event} hook matches", err=True)
    from dsh_hooks.events import blocks

    blocked = False
    for ans in answers:
        # As a run reads it: exit 2, a JSON permissionDecision "deny" (PreToolUse) or a
        # top-level decision "block" (the events that take one) is a block.
        said = json.dumps(ans.json, ensure_ascii=False) if ans.json is not None else ans.text
        why = blocks(event, ans)
        kind = "block" if why is not None else ans.kind
        blocked = blocked or why is not None
        detail = why or ans.reason or said
        click.echo(_line(f"{kind}\t{ans.name}\t{detail}"))
    if blocked:
        raise SystemExit(2)
