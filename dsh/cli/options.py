"""What the options of ``dsh run``, ``dsh chat`` and ``dsh batch`` turn into: ``-L`` limits
(:func:`parse_limits`), ``-o`` model options (:func:`parse_options`), the agent overrides of
``-m -s --max-steps -o`` (:func:`agent_overrides`), the agent assembled with the ``-T`` allow
list (:func:`assemble_agent`), and the session to resume for ``-c`` / ``--session`` — an id,
its short form (the end of its random part), a unique prefix of one, or ``latest``
(:func:`session_to_resume`, :func:`resolve_session`) — with the model it recorded
(:func:`keep_session_model`).

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
                   tools: tuple[str, ...], no_tools: bool = False,
                   note: bool = True) -> tuple[Any, dict[str, Any]]:
    """The agent with ``overrides`` and the ``-T`` allow list (an unknown tool is a usage
    error naming the available ones; ``-T ''`` and ``--no-tools`` mean no tool at all); with
    ``note``, says so when the offline default model answers (:func:`note_default_model`)."""
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
    if note:
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
    warn(f"warning: the cost limit ({where}) cannot apply: model {agent.model_id!r} has no "
         f"known price; set [models.{key}] price = {{input = …, output = …}} (dollars per "
         "million tokens)")


def session_to_resume(app: App, agent: Any, continue_: bool, session_id: str | None,
                      any_dir: bool = False) -> str | None:
    """``-c`` (the agent's latest session in the current directory — of any directory with
    ``any_dir`` —, with a note when there is none), ``--session``, or a new fork of
    ``--fork``'s session (made here, named on stderr)."""
    fork_id = click.get_current_context().meta.get("dsh.fork")
    if fork_id:
        if continue_ or session_id:
            raise click.UsageError("--fork cannot be combined with -c or --session")
        from dsh.ledger.fork import fork

        parent = resolve_session(app, fork_id)
        new = fork(app.store, parent)
        warn(f"forked {parent} as {new}")
        return new
    if continue_:
        cwd = None if any_dir else _cwd()
        resume = latest_session(app, agent.name, cwd=cwd, any_dir=any_dir)
        if resume is None:
            where = "" if any_dir else f" in {cwd or 'this directory'}"
            hint = "" if any_dir else " (--any-dir continues the latest of any directory)"
            warn(f"no session of agent {agent.name}{where} to continue; starting a new "
                 f"one{hint}")
        return resume
    return resolve_session(app, session_id) if session_id else None


def _cwd() -> str | None:
    import os

    try:
        return os.getcwd()
    except OSError:
        return None


def keep_session_model(app: App, agent: Any, overrides: dict[str, Any],
                       resume: str | None) -> tuple[Any, dict[str, Any]]:
    """A resumed session runs on the model its last turn recorded unless ``-m`` chose one
    (then one ``dsh: note:`` line when that changes it): the agent to run and its overrides
    (with the recorded ``model``, so that a chat's later switches keep it)."""
    if resume is None:
        return agent, overrides
    from dsh.core.errors import DshError

    recorded = _recorded_model(app.store, resume)
    if not recorded or recorded in (agent.model_id, _effective(agent)):
        return agent, overrides
    if "model" in overrides:  # said once the session is open (a locked one says only that)
        click.get_current_context().meta["dsh.model_note"] = (
            f"note: session {resume} continues on {agent.model_id} (was {recorded})")
        return agent, overrides
    kept = {**overrides, "model": recorded}
    try:
        kept_agent = app.agent(agent.name, **kept)
        kept_agent.model  # noqa: B018 - built now: a model that cannot be is said here
        return kept_agent, kept
    except DshError as exc:
        from dsh.core.errors import UsageError

        raise UsageError(f"session {resume} runs on model {recorded!r}, which cannot be used "
                         f"here ({exc}); choose one with -m MODEL") from None


def note_model_switch() -> None:
    """The ``-m`` note of :func:`keep_session_model`, once the session it is about is open."""
    note = click.get_current_context().meta.pop("dsh.model_note", None)
    if note:
        warn(note)


def _effective(agent: Any) -> str | None:
    """The id the agent's adapter records (an alias resolved), None when it cannot be built."""
    from dsh.core.errors import DshError

    try:
        return str(agent.effective_model)
    except DshError:
        return None


def _recorded_model(store: Any, session_id: str) -> str:
    """The model the session's last turn named (``turn/start`` ``model``), ``""`` if none."""
    from dsh.core.errors import DshError

    try:
        info = store.info(session_id) if hasattr(store, "info") else None
        if info is not None:
            return str(info.model or "")
        model = ""
        for event in store.read(session_id):
            if getattr(event, "type", "") == "turn/start" and getattr(event, "model", None):
                model = str(event.model)
        return model
    except DshError:  # unreadable: opening it says why
        return ""


def note_default_model(app: App, agent: Any, overrides: dict[str, Any]) -> None:
    """Say so when nothing chose a model and the offline ``echo`` one answers."""
    if ("model" in overrides or app.config.agent_config(agent.name).model
            or not app.default_model.fallback):
        return
    warn("note: no model configured, so the offline echo model answers (it repeats the "
         "prompt). Choose one with `dsh config set model openai:gpt-4o-mini` (and set "
         "OPENAI_API_KEY), or pass -m MODEL; `dsh models` lists them")


def latest_session(app: App, agent: str | None = None, *, cwd: str | None = None,
                   any_dir: bool = True) -> str | None:
    """The newest session (of ``agent``; recorded in directory ``cwd`` unless ``any_dir``)
    that is not a sub-agent's; sessions that cannot be read (or are empty) are passed over.
    A session an older dsh recorded names no directory: only ``any_dir`` finds it."""
    from dsh.ledger.reader import newest_sessions

    for info in newest_sessions(app.store, agent, roots=True):
        if any_dir or (cwd is not None and getattr(info, "cwd", None) == cwd):
            return str(info.id)
    return None


def resolve_session(app: App, text: str) -> str:
    """A session id from ``text``: an id, its short form (``1a0a61``, or the last 4 or more
    characters of it, for ``20261202-060357.140-1a0a61``), a unique prefix of one, or
    ``latest``, the newest of any directory (:func:`dsh.ledger.reader.resolve`)."""
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
                     help="Continue the agent's latest session in the current directory, "
                          "on the model it recorded (unless -m)."),
        click.option("--any-dir", is_flag=True,
                     help="With -c: the latest session of any directory."),
        click.option("--session", "session_id", metavar="ID",
                     help="Resume session ID (an id, its random last part, a unique prefix, "
                          "or latest), on the model it recorded (unless -m)."),
        click.option("--fork", "fork_id", metavar="ID", expose_value=False,
                     callback=lambda ctx, _, value: ctx.meta.__setitem__("dsh.fork", value),
                     help="Continue in a new fork of session ID (its whole history; ID is "
                          "left as it is)."),
    )):
        f = option(f)
    return f
