"""``dsh sessions``: list, show, compact, export and remove saved sessions.

Imported on demand by :class:`dsh.cli.root.DshGroup`. Resolving an ID (full, prefix, ``latest``) is
:func:`dsh.cli.options.resolve_session`, shared with ``dsh run --session``; the views are in
:mod:`dsh.cli.render`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import click

from dsh.cli.options import resolve_session
from dsh.cli.shared import State
from dsh.cli.shared import _dump
from dsh.cli.shared import os_reason
from dsh.cli.shared import pass_state
from dsh.cli.shared import warn
from dsh.core import errors

if TYPE_CHECKING:
    from dsh.run.app import App


@click.group()
def sessions() -> None:
    """List, show, search, export and remove saved sessions.

    ID may be a full session id, a unique prefix of one, or `latest`.
    """


#: How many sessions ``sessions list`` shows, and hits ``sessions search``, without -n/--all.
DEFAULT_LIMIT = 20


def _filters(command: Any) -> Any:
    """The options ``list`` and ``search`` share to choose sessions."""
    for option in reversed((
        click.option("-a", "--agent", help="Only the sessions of this agent."),
        click.option("-m", "--model", help="Only the sessions that used this model (the one "
                     "listed, or one that gave a response)."),
        click.option("--since", metavar="WHEN", help="Only the sessions started since WHEN: a "
                     "date (2026-12-01), a local time (2026-12-01T09:30) or an age (7d, 24h)."),
        click.option("--cwd", metavar="DIR", help="Only the sessions recorded in DIR or a "
                     "directory beneath it."),
    )):
        command = option(command)
    return command


def _count(limit: int | None, show_all: bool) -> int | None:
    if show_all and limit is not None:
        raise errors.UsageError("give -n/--limit or --all, not both")
    return None if show_all else (limit or DEFAULT_LIMIT)


@sessions.command("list")
@_filters
@click.option("-n", "--limit", type=click.IntRange(min=1),
              help=f"Show at most this many (default {DEFAULT_LIMIT}).")
@click.option("--all", "show_all", is_flag=True, help="Show every session.")
@click.option("-q", "--query", metavar="TEXT", help="Only the sessions whose messages, tool "
              "calls or tool results hold every word of TEXT (as `sessions search`).")
@click.option("--tree", is_flag=True,
              help="Show forks and sub-agents' sessions under the session they came from.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@pass_state
def sessions_list(state: State, agent: str | None, model: str | None, since: str | None,
                  cwd: str | None, limit: int | None, show_all: bool, query: str | None,
                  tree: bool, as_json: bool) -> None:
    """List sessions, newest first: id, agent, model, start, turns, cost, directory, first
    prompt — the 20 newest unless -n or --all.

    A ledger that cannot be read (permissions, not a regular file, empty) is skipped with a
    `dsh: warning: skipped: REASON` line on stderr; the others are listed.
    """
    from dsh.cli.session_list import accepting
    from dsh.cli.session_list import chosen
    from dsh.ledger.search import with_usage
    from dsh.run.costs import app_prices
    from dsh.run.costs import cost_of

    app = state.app
    count = _count(limit, show_all)
    accept = accepting(agent=agent, model=model, since=since, cwd=cwd)
    found = chosen(app, agent, accept, query, None if tree or count is None else count + 1)
    depths = None
    if tree:
        from dsh.cli.session_list import tree as as_tree

        shown, depths = as_tree(found, count)
        more = count is not None and len(shown) < len(found) and any(
            depths.get(i.id) is None and not (i.parent or i.forked_from) for i in found)
        found = shown
    else:
        more = count is not None and len(found) > count
        found = found[:count]
    found = with_usage(app.store, found)
    prices = app_prices(app)
    costs = {s.id: cost_of(s.usage, prices) for s in found}
    if as_json:
        _dump([{"id": s.id, "agent": s.agent, "model": s.model, "started": s.started,
                "turns": s.turns, "first_prompt": s.first_prompt, "path": str(s.path),
                "parent": s.parent, "cwd": s.cwd, "forked_from": s.forked_from,
                "cost": costs[s.id]} | ({"depth": depths[s.id]} if depths is not None else {})
               for s in found])
        return
    if not found:
        warn("no sessions")
        return
    import shutil

    from dsh.cli.session_list import sessions_table

    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else 120
    click.echo(sessions_table(found, width, terminal=sys.stdout.isatty(), costs=costs,
                              depths=depths))
    if more and sys.stdout.isatty():
        warn(f"the {count} newest shown: -n N or --all for more")


@sessions.command("search")
@click.argument("text", metavar="TEXT")
@_filters
@click.option("-n", "--limit", type=click.IntRange(min=1),
              help=f"Show at most this many hits (default {DEFAULT_LIMIT}).")
@click.option("--all", "show_all", is_flag=True, help="Show every hit.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of the hits.")
@pass_state
def sessions_search(state: State, text: str, agent: str | None, model: str | None,
                    since: str | None, cwd: str | None, limit: int | None, show_all: bool,
                    as_json: bool) -> None:
    """Search the sessions' messages, tool calls and tool results for TEXT.

    TEXT is plain text: every word of it (letters and digits; case, punctuation and order
    ignored) must be in one message, call or result. Each hit prints its session, turn and
    a snippet, newest session first. Exit 0 with hits, 1 with none (as grep).
    """
    from dsh.cli.session_list import accepting
    from dsh.cli.session_list import hit_json
    from dsh.cli.session_list import hit_lines
    from dsh.ledger.search import search
    from dsh.ledger.search import words

    terms = words(text)
    if not terms:
        raise errors.UsageError("search TEXT has no words (letters or digits) to look for")
    accept = accepting(agent=agent, model=model, since=since, cwd=cwd)
    hits = search(state.app.store, text, accept=accept, limit=_count(limit, show_all),
                  on_skip=lambda path, reason: warn(f"warning: skipped: {reason}"))
    if as_json:
        _dump([hit_json(h, terms) for h in hits])
    elif hits:
        import shutil

        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else 120
        click.echo(hit_lines(hits, terms, width))
    else:
        warn("no matches")
    if not hits:
        click.get_current_context().exit(1)


@sessions.command("show")
@click.argument("session_id", metavar="ID")
@click.option("--full", is_flag=True,
              help="Show tool outputs, system prompts and reasoning in full.")
@click.option("--json", "as_json", is_flag=True, expose_value=False,
              callback=lambda ctx, _, value: ctx.meta.__setitem__("dsh.show_json", value),
              help="Print one JSON object: the session's id, its events and its attachments "
                   "(each with a problem, null when its bytes are there).")
@pass_state
def sessions_show(state: State, session_id: str, full: bool) -> None:
    """Show a session as a USER / ASSISTANT / TOOL timeline.

    The first line names the session and the directory it was recorded in; each turn's last
    line its tokens and cost, each sub-agent's its own under the call that started it, and
    the usage line the total. Plugin events (x/PLUGIN/NAME) are shown with their data,
    marked when the plugin is not installed."""
    from dsh.cli.escape import use_color
    from dsh.cli.render import trajectory
    from dsh.ledger.plugin_events import is_installed

    app = state.app
    store = app.store
    color = use_color(sys.stdout)
    reader = app.reader(session_id)  # read-only: no model, no key, no lock (issue 25)
    events = list(reader)
    if click.get_current_context().meta.get("dsh.show_json"):
        _show_json(store, events)
        return
    from dsh.llm.attachments import problems
    from dsh.run.costs import app_prices

    click.echo(_header(reader.id, events, sys.stdout.isatty(), store))
    price = app_prices(app)
    click.echo(trajectory(events, color=color, full=full, children=store.read,
                          terminal=sys.stdout.isatty(),
                          installed=lambda plugin: is_installed(app, plugin),
                          attachment_problem=problems(store, events), price=price), nl=False,
               color=color)
    from dsh.cli.render import usage_totals

    totals = usage_totals(events, price, store.read)
    if totals is not None:
        click.echo(totals)
    click.echo(_context_line(state.app, events, store))
    from dsh.ledger.reader import describe_states

    recorded = describe_states(reader)
    if recorded:
        from dsh.cli.render import escape_controls

        click.echo(escape_controls(recorded))


def _header(sid: str, events: list[Any], terminal: bool, store: Any = None) -> str:
    """``session ID · cwd DIR``: the directory of the first turn that recorded one (a session
    an older dsh recorded names none); then, for a fork, ``forked from PARENT at turn N``,
    and the forks made of this session (``forks: ID, …``)."""
    cwd = next((e.cwd for e in events if getattr(e, "type", "") == "turn/start"
                and getattr(e, "cwd", None)), None)
    line = f"session {sid} · cwd {cwd if cwd is not None else 'not recorded'}"
    head = events[0] if events else None
    if getattr(head, "type", "") == "session/fork":
        how = "rewound" if head.reason == "rewind" else "forked"
        line += f"\n{how} from {head.parent} at turn {head.turn}"
    forks = [info.id for info in _sessions(store) if info.forked_from == sid]
    if forks:
        line += f"\nforks: {', '.join(reversed(forks))}"
    if terminal:
        from dsh.cli.escape import escape_controls

        line = escape_controls(line)
    return line


def _sessions(store: Any) -> list[Any]:
    """Every session of the built-in store (from its index), for the forks of one; none for
    a plugin's store."""
    from dsh.ledger.store import JsonlStore

    if not isinstance(store, JsonlStore):
        return []
    return list(store.sessions())


def _show_json(store: Any, events: list[Any]) -> None:
    """``sessions show --json``: ``{"id", "events", "attachments"}`` on one line."""
    import json

    from dsh.ledger.serialize import dump_event
    from dsh.llm.attachments import listing

    sid = events[0].session if events else ""
    click.echo(json.dumps({"id": sid, "events": [json.loads(dump_event(e)) for e in events],
                           "attachments": listing(store, events)}, ensure_ascii=False))


def _context_line(app: App, events: list[Any], blobs: Any = None) -> str:
    """``context: ~N tokens of W (k compactions)`` for the session's next request."""
    from dsh.ledger.fragments import FragmentMissing
    from dsh.ledger.history import Projection
    from dsh.run.compaction import ContextMeter
    from dsh.run.compaction import agent_window

    proj = Projection()
    proj.blobs = blobs  # where a message's fragment texts are (dsh.ledger.fragments)
    agent_name = ""
    try:
        for e in events:
            proj.apply(e)
            agent_name = agent_name or getattr(e, "agent", "") or ""
    except FragmentMissing as exc:  # the view is shown; the next request could not be sent
        return f"context: unknown ({exc})"
    used = ContextMeter().used(proj)
    window: int | None = None
    try:
        window = agent_window(app.agent(agent_name or None, model=proj.model or None))
    except Exception:  # noqa: BLE001 - an unknown agent/model or a missing key: no window
        window = None
    of = f" of {window} ({used * 100 // window}%)" if window else " (window unknown)"
    n = proj.compactions
    return f"context: ~{used} tokens{of}, {n} compaction{'s' if n != 1 else ''}"


@sessions.command("compact")
@click.argument("session_id", metavar="ID")
@click.option("--strategy",
              help="auto, mask, summarize, truncate, or a plugin's (default: the agent's).")
@pass_state
def sessions_compact(state: State, session_id: str, strategy: str | None) -> None:
    """Compact a session's context now (recorded as a context/compacted event)."""
    from dsh.run.compaction import compact_session

    sid = resolve_session(state.app, session_id)
    event = compact_session(state.app, sid, strategy=strategy)
    if event is None:
        warn(f"{sid}: nothing to compact")
        return
    warn(f"{sid}: compacted messages {event.start}-{event.end} ({event.strategy}): "
         f"~{event.tokens_before} -> ~{event.tokens_after} tokens")


@sessions.command("export")
@click.argument("session_id", metavar="ID")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "markdown", "html"]),
              default="markdown", show_default=True,
              help="jsonl: the ledger's lines; markdown: a transcript; html: a one-file page.")
@click.option("--html", "fmt", flag_value="html", help="Same as --format html.")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write to this file instead of stdout.")
@click.option("--otlp", is_flag=True,
              help="Send the session's trace to an OpenTelemetry collector instead "
                   "(`dsh otel export ID`: needs the dsh-otel plugin).")
@pass_state
def sessions_export(state: State, session_id: str, fmt: str, output: Path | None,
                    otlp: bool) -> None:
    """Export a session as JSON Lines, Markdown or one self-contained HTML page, or send its
    trace over OTLP."""
    if otlp:
        _send_otlp(session_id, output)
        return
    reader = state.app.reader(session_id)  # read-only: no lock, no model, no key
    sid, events = reader.id, list(reader)
    if fmt == "html":
        from dsh.cli.export_html import page_of

        text = page_of(state.app, sid, events)
    elif fmt == "jsonl":
        from dsh.ledger.serialize import dump_event

        text = "".join(dump_event(e) + "\n" for e in events)
    else:
        from dsh.cli.render import markdown

        text = markdown(sid, events)
    if output is None:
        if sys.stdout.isatty():  # a pipe gets the bytes; a terminal sees controls escaped
            from dsh.cli.escape import escape_controls
            from dsh.cli.escape import escape_json_controls

            text = escape_json_controls(text) if fmt == "jsonl" else escape_controls(text)
        click.echo(text, nl=False)
    else:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise errors.DshError(f"cannot write {output}: {os_reason(exc)}") from None
        warn(f"wrote {output}")


def _send_otlp(session_id: str, output: Path | None) -> None:
    """``--otlp``: the ``otel export`` command a plugin registered (dsh-otel), found by name
    through the root group as ``dsh otel export`` is, never imported from here."""
    if output is not None:
        raise errors.UsageError("--otlp sends the trace to a collector: --output does not apply")
    ctx = click.get_current_context()
    root = ctx.find_root()
    group = root.command.get_command(root, "otel") if isinstance(root.command,
                                                                   click.Group) else None
    command = group.get_command(ctx, "export") if isinstance(group, click.Group) else None
    if command is None:
        raise errors.UsageError("--otlp: no plugin provides `dsh otel export` "
                                "(pip install dsh-otel)")
    ctx.invoke(command, session_id=session_id, endpoint=None, content=None)


@sessions.command("path")
@click.argument("session_id", metavar="ID")
@pass_state
def sessions_path(state: State, session_id: str) -> None:
    """Print the path of a session's ledger file."""
    path = state.app.store.path(resolve_session(state.app, session_id))
    if path.exists() and not path.is_file():
        raise errors.LedgerError(f"{path} is {'a directory' if path.is_dir() else 'a FIFO'}"
                                 ", not a session ledger file")
    click.echo(str(path))


@sessions.command("rm")
@click.argument("session_ids", metavar="[ID...]", nargs=-1)
@click.option("--older-than", type=click.FloatRange(min=0, min_open=True), metavar="DAYS",
              help="Remove every session last written more than DAYS days ago.")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@pass_state
def sessions_rm(state: State, session_ids: tuple[str, ...], older_than: float | None,
                dry_run: bool) -> None:
    """Remove sessions, by ID or by age (a session in use by a running dsh is refused)."""
    app = state.app
    if older_than is None and not session_ids:
        raise errors.UsageError("give the IDs of the sessions to remove, or --older-than DAYS")
    if older_than is not None and session_ids:
        raise errors.UsageError("give session IDs or --older-than DAYS, not both")
    if older_than is not None:
        from dsh.cli.session_list import prune

        prune(app, older_than, dry_run)
        return
    for text in session_ids:
        sid = resolve_session(app, text)
        if dry_run:
            warn(f"would remove {app.store.path(sid)}")
            continue
        path = app.store.remove(sid)
        warn(f"removed {path}")


def newest(app: App, agent: str | None = None, *, report: bool = False,
           limit: int | None = None) -> list[Any]:
    """Sessions (of ``agent``), newest first (ids sort by creation, to the millisecond), at
    most ``limit``: the store's session index reads no more ledgers than it shows. With
    ``report``, each ledger that cannot be listed gets a ``dsh: warning: skipped`` line."""
    from itertools import islice

    from dsh.ledger.reader import newest_sessions

    on_skip = (lambda path, reason: warn(f"warning: skipped: {reason}")) if report else None
    return list(islice(newest_sessions(app.store, agent, on_skip=on_skip), limit))


# fork and rewind (sessions form a tree): registered on the group above
from dsh.cli.commands import session_tree as _session_tree  # noqa: E402,F401
