"""What the options of ``dsh run``, ``dsh chat`` and ``dsh batch`` turn into: ``-L`` limits
(:func:`parse_limits`), ``-o`` model options (:func:`parse_options`), the agent overrides of
``-m -s --max-steps -o`` (:func:`agent_overrides`), the agent assembled with the ``-T`` allow
list (:func:`assemble_agent`), and the session to resume for ``-c`` / ``--session`` — an id,
a unique prefix of one, or ``latest`` (:func:`session_to_resume`, :func:`resolve_session`).

Imports only click and :mod:`dsh.cli.shared` at import time; the config, the run context and
the sanitiser are imported when an option needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

import click

from dsh.cli.shared import warn

if TYPE_CHECKING:
    from dsh.run.app import App


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


MODE_HELP = ("Permission mode: read-only, plan (read-only until you approve the model's "
             "plan), ask (default: writes and unlisted commands ask), "
             "auto-edit (writes in the workspace run), full-auto (everything inside the "
             "sandbox runs).")


def agent_overrides(model: str | None, system: str | None, max_steps: int | None,
                    options: tuple[str, ...], mode: str | None = None) -> dict[str, Any]:
    """The agent overrides of ``dsh run``, ``dsh chat`` and ``dsh batch`` (``-m -s
    --max-steps -o --mode``)."""
    overrides: dict[str, Any] = {"model": model, "system": _utf8(system, "-s"),
                                 "max_steps": max_steps, "mode": mode,
                                 "options": _utf8(parse_options(options) or None, "-o")}
    return {k: v for k, v in overrides.items() if v is not None}


def assemble_agent(app: App, agent: str | None, overrides: dict[str, Any],
                   tools: tuple[str, ...], no_tools: bool = False) -> tuple[Any, dict[str, Any]]:
    """The agent with ``overrides`` and the ``-T`` allow list (an unknown tool is a usage
    error naming the available ones; ``-T ''`` and ``--no-tools`` mean no tool at all); says
    so when the offline default model answers."""
    allow = [t.strip() for item in tools for t in item.split(",") if t.strip()]
    overrides = dict(overrides)
    if no_tools or (tools and not allow):
        if allow:
            from dsh.core.errors import UsageError

            raise UsageError("--no-tools cannot be combined with -T NAME")
        overrides["tools"] = []
    elif allow:
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


def note_yes(yes: bool, agent: Any) -> None:
    """``--yes`` says in one line what it approves."""
    if yes:
        warn(f"--yes: every tool call that would ask is approved in this run (mode "
             f"{agent.mode}: calls the mode refuses stay refused)")


def note_unpriced(agent: Any, limits: Any) -> None:
    """A cost limit (``-L cost=``, ``[limits] cost``) on a model with no known price cannot
    apply (its requests cost 0): one warning line naming the setting that gives it one."""
    cost = getattr(limits, "cost", None)
    where = f"-L cost={cost:g}" if cost is not None else None
    if cost is None and getattr(agent.limits, "cost", None) is not None:
        where = f"[limits] cost = {agent.limits.cost:g}"
    if where is None or agent.price is not None:
        return
    import json

    key = json.dumps(agent.model_id)
    warn(f"warning: the cost limit ({where}) cannot apply: model {agent.model_id!r} has no known price; "
         f"set [models.{key}] price = {{input = …, output = …}} (dollars per million tokens)")


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
    from dsh.ledger.reader import newest_sessions

    for info in newest_sessions(app.store, agent, roots=True):
        return str(info.id)
    return None


def resolve_session(app: App, text: str) -> str:
    """A session id from ``text``: an id, a unique prefix of one, or ``latest``
    (:func:`dsh.ledger.reader.resolve`)."""
    from dsh.ledger.reader import resolve

    return resolve(app.store, text)


def agent_and_session_options(f: Any) -> Any:
    """``-m -s -a -c --session``: which agent runs and on which session, the same for
    ``dsh run`` and ``dsh chat``."""
    for option in reversed((
        click.option("-m", "--model",
                     help="Model id: echo, scripted:FILE, openai:gpt-4o-mini, …"),
        click.option("-s", "--system", help="System prompt (replaces the agent's own)."),
        click.option("-a", "--agent",
                     help="Agent from the config (default: the config's `agent`)."),
        click.option("-c", "--continue", "continue_", is_flag=True,
                     help="Continue the agent's latest session."),
        click.option("--session", "session_id", metavar="ID", help="Resume session ID."),
    )):
        f = option(f)
    return f
