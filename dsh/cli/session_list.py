"""The views and filters of ``dsh sessions list``, ``search`` and ``rm --older-than``: the
sessions table (with cost and working directory), the fork / sub-agent tree, search hits
with their snippets, and the ``--since`` / ``--cwd`` / ``--model`` filters.

Text from a ledger is untrusted: on a terminal the table's cells are shown with their
controls made visible, and a snippet always is (it is a view cut from a message, never the
message's bytes: ``--json`` has the text as data).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from collections.abc import Iterable
from datetime import UTC
from datetime import datetime
from typing import Any

from dsh.cli.escape import escape_controls
from dsh.cli.escape import one_line
from dsh.cli.shared import warn
from dsh.cli.timefmt import local_time
from dsh.core import errors
from dsh.core.errors import UsageError

#: The width of the CWD column at most (a longer directory keeps its end: ``…/proj/src``).
CWD_WIDTH = 28
_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*([wdhm])")
_UNITS = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60}


# --- filters -------------------------------------------------------------------------------


def since_stamp(text: str, now: float | None = None) -> str:
    """``--since``: a date (``2026-12-01``, local midnight), a local time
    (``2026-12-01T09:30``) or an age (``7d``, ``24h``, ``30m``, ``2w``), as the UTC stamp a
    session's ``started`` is compared with."""
    value = text.strip()
    m = _AGE.fullmatch(value)
    if m:
        at = (time.time() if now is None else now) - float(m.group(1)) * _UNITS[m.group(2)]
        when = datetime.fromtimestamp(at, UTC)
    else:
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            raise UsageError(f"--since {text[:80]!r}: give a date (2026-12-01), a local time "
                             "(2026-12-01T09:30) or an age (7d, 24h, 30m)") from None
        when = when.astimezone(UTC)  # a naive time is local
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def cwd_forms(directory: str) -> tuple[str, ...]:
    """``--cwd DIR``: the directory as given made absolute, and with its links resolved."""
    given = os.path.abspath(os.path.expanduser(directory))
    return tuple(dict.fromkeys((given, os.path.realpath(given))))


def under(cwd: str | None, forms: tuple[str, ...]) -> bool:
    """Whether a session's ``cwd`` is one of ``forms`` or a directory beneath it."""
    if not cwd:
        return False
    return any(cwd == f or cwd.startswith(f.rstrip("/") + "/") for f in forms)


def accepting(*, agent: str | None = None, model: str | None = None,
              since: str | None = None, cwd: str | None = None
              ) -> Callable[[Any], bool] | None:
    """The filter of a listing or search (None: every session): ``agent`` its agent,
    ``model`` its listed model or one it got a response from (``usage``), ``since`` started
    at or after (:func:`since_stamp`), ``cwd`` recorded in or beneath."""
    stamp = since_stamp(since) if since is not None else None
    forms = cwd_forms(cwd) if cwd is not None else None
    if agent is None and model is None and stamp is None and forms is None:
        return None

    def accept(info: Any) -> bool:
        if agent is not None and info.agent != agent:
            return False
        if stamp is not None and not (info.started and info.started >= stamp):
            return False
        if forms is not None and not under(getattr(info, "cwd", None), forms):
            return False
        if model is not None and info.model != model and not any(
                u[0] == model for u in getattr(info, "usage", ())):
            return False
        return True

    return accept


# --- choosing sessions ---------------------------------------------------------------------


def chosen(app: Any, agent: str | None, accept: Any, query: str | None,
            limit: int | None) -> list[Any]:
    """The sessions ``list`` shows (at most ``limit``), newest first."""
    def skip(path: Any, reason: str) -> None:
        warn(f"warning: skipped: {reason}")

    if query is not None:
        from dsh.ledger.search import search
        from dsh.ledger.search import words

        if not words(query):
            raise errors.UsageError("-q/--query TEXT has no words (letters or digits) to "
                                    "look for")
        return [h.session for h in search(app.store, query, accept=accept, limit=limit,
                                          per_session=True, on_skip=skip)]
    from dsh.ledger.reader import newest_sessions
    from dsh.ledger.search import with_usage

    found: list[Any] = []
    batch: list[Any] = []
    sessions = newest_sessions(app.store, agent, on_skip=skip)
    while limit is None or len(found) < limit:
        batch = [s for _, s in zip(range(64), sessions, strict=False)]
        if not batch:
            break
        if accept is not None:  # the model filter looks at usage: read where it is asked
            batch = [s for s in with_usage(app.store, batch) if accept(s)]
        found.extend(batch)
    return found[:limit]


def prune(app: Any, days: float, dry_run: bool) -> None:
    """``rm --older-than``: every session whose ledger was last written (its mtime, never a
    link's target: a symbolic link is not a session) more than ``days`` days ago."""
    import stat

    from dsh.ledger.reader import newest_sessions

    cutoff = time.time() - days * 86400

    def old(path: Any) -> bool:
        try:
            st = os.lstat(path)
        except (OSError, TypeError, ValueError):
            return False
        return stat.S_ISREG(st.st_mode) and st.st_mtime < cutoff

    found = [s for s in newest_sessions(app.store, on_skip=lambda p, reason: warn(
        f"warning: skipped: {reason}")) if s.path is not None and old(s.path)]
    done, kept = 0, 0
    for info in reversed(found):  # oldest first
        if dry_run:
            warn(f"would remove {info.path}")
            done += 1
            continue
        if not old(info.path):  # written since it was listed
            continue
        try:
            path = app.store.remove(info.id)
        except errors.DshError as exc:
            warn(f"warning: kept {info.id}: {exc}")
            kept += 1
            continue
        warn(f"removed {path}")
        done += 1
    verb = "would remove" if dry_run else "removed"
    warn(f"{verb} {done} session{'s' if done != 1 else ''} last written more than {days:g} "
         f"day{'s' if days != 1 else ''} ago")
    if kept:
        raise errors.LedgerError(f"{kept} session{'s' if kept != 1 else ''} could not be "
                                 "removed (see above)")


# --- the table -----------------------------------------------------------------------------


def short_cwd(cwd: str | None, width: int = CWD_WIDTH) -> str:
    """A session's directory for the table: ``~`` for the home directory, the end kept."""
    if not cwd:
        return "-"
    home = os.path.expanduser("~")
    if home not in ("", "/") and (cwd == home or cwd.startswith(home + "/")):
        cwd = "~" + cwd[len(home):]
    return cwd if len(cwd) <= width else "…" + cwd[len(cwd) - width + 1:]


def cost_text(cost: float | None) -> str:
    """A cost cell: ``$0.0123``, ``-`` when no model of the session has a price."""
    if cost is None:
        return "-"
    return f"${cost:.2f}" if cost >= 1 else f"${cost:.4f}"


def sessions_table(rows: Iterable[Any], width: int | None = None, *, terminal: bool = False,
                   costs: dict[str, float | None] | None = None,
                   depths: dict[str, int] | None = None) -> str:
    """The ``dsh sessions list`` table: id, agent, model, start, turns, cost, directory,
    first prompt (``↳`` marks a sub-agent's session, ``⑂`` a fork). ``costs``: each
    session's cost by id (no COST column without it); ``depths``: the tree view's depth of
    each (``--tree``: ids indented under their parent). ``terminal``: controls in the cells
    are made visible (:func:`escape_controls`)."""
    clean: Callable[[str], str] = (
        (lambda t: escape_controls(t, newlines=False)) if terminal else (lambda t: t))
    header = ["ID", "AGENT", "MODEL", "STARTED", "TURNS"] + (["COST"] if costs is not None
                                                            else []) + ["CWD", "FIRST PROMPT"]
    cells = [header]
    for r in rows:
        mark = "↳ " if getattr(r, "parent", None) else (
            "⑂ " if getattr(r, "forked_from", None) else "")
        ident = clean(r.id)
        if depths is not None:
            depth = depths.get(r.id, 0)
            ident = "  " * max(0, depth - 1) + (mark if depth else "") + ident
            mark = ""
        cells.append([ident, clean(r.agent), clean(r.model),
                      local_time(r.started) if r.started else "", str(r.turns)]
                     + ([cost_text(costs.get(r.id))] if costs is not None else [])
                     + [clean(short_cwd(getattr(r, "cwd", None))),
                        mark + clean(" ".join(r.first_prompt.split()))])
    n = len(header) - 1
    widths = [max(len(c[i]) for c in cells) for i in range(n)]
    last = max(20, (width or 100) - sum(widths) - 2 * n)
    lines = []
    for c in cells:
        fixed = "  ".join(v.ljust(w) for v, w in zip(c[:n], widths, strict=True))
        lines.append((fixed + "  " + one_line(c[n], last)).rstrip())
    return "\n".join(lines)


def tree(infos: list[Any], roots: int | None) -> tuple[list[Any], dict[str, int]]:
    """``--tree``: ``infos`` (newest first) as trees — each session under the one it was
    forked from or whose sub-agent it is, children oldest first — of the ``roots`` newest
    top-level sessions (a session whose parent is not listed is one); the order to show and
    each session's depth."""
    by_id = {i.id: i for i in infos}
    children: dict[str, list[Any]] = {}
    tops = []
    for info in infos:
        up = info.parent or getattr(info, "forked_from", None)
        if up and up in by_id and up != info.id:
            children.setdefault(up, []).append(info)
        else:
            tops.append(info)
    order: list[Any] = []
    depths: dict[str, int] = {}
    seen: set[str] = set()

    def walk(info: Any, depth: int) -> None:
        if info.id in seen:  # a cycle of hand-edited ledgers: each session once
            return
        seen.add(info.id)
        order.append(info)
        depths[info.id] = depth
        for child in reversed(children.get(info.id, [])):
            walk(child, depth + 1)

    for top in tops[:roots] if roots is not None else tops:
        walk(top, 0)
    return order, depths


# --- search hits ---------------------------------------------------------------------------


def snippet(text: str, terms: list[str], width: int, *, escape: bool = True) -> str:
    """``text`` on one line, cut to ``width`` around the first of ``terms`` it holds, its
    controls made visible (unless not ``escape``: JSON data)."""
    flat = " ".join(text.split())
    low = flat.lower()
    at = min((p for p in (low.find(t) for t in terms) if p >= 0), default=0)
    if len(low) != len(flat):  # lower() changed lengths (rare letters): no centring
        at = 0
    start = max(0, at - width // 3)
    if start and len(flat) - start < width:
        start = max(0, len(flat) - width)
    cut = flat[start:start + width]
    text = ("…" if start else "") + cut + ("…" if start + width < len(flat) else "")
    return escape_controls(text, newlines=False) if escape else text


def where(hit: Any) -> str:
    """``user``, ``assistant``, ``call NAME``, ``result NAME``."""
    return hit.kind + (f" {hit.name}" if hit.name else "")


def hit_lines(hits: list[Any], terms: list[str], width: int) -> str:
    """``ID  turn N  WHERE: SNIPPET`` per hit, every control character made visible."""
    lines = []
    for h in hits:
        head = escape_controls(f"{h.session.id}  turn {h.turn}  {where(h)}: ", newlines=False)
        lines.append(head + snippet(h.text, terms, max(20, width - len(head))))
    return "\n".join(lines)


def hit_json(hit: Any, terms: list[str]) -> dict[str, Any]:
    s = hit.session
    return {"id": s.id, "turn": hit.turn, "seq": hit.seq, "kind": hit.kind, "name": hit.name,
            "snippet": snippet(hit.text, terms, 160, escape=False), "agent": s.agent,
            "model": s.model, "started": s.started, "cwd": getattr(s, "cwd", None),
            "path": str(s.path)}
