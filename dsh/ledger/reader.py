"""The read-only session API (issue 25): open a stored session without a model, a key or its
lock, and read its events, plugin events, history and recorded state.

For plugin commands, scripts and dsh's own ``sessions show``/``export``::

    from dsh.ledger.reader import open_session

    reader = open_session(app.store, "latest")      # an id, a unique prefix, or "latest"
    for event in reader.events():                   # typed events, oldest first
        ...
    reader.plugin_events("warden", "refused")       # x/warden/refused, oldest first
    reader.state(COUNT)                             # a StateKey's value at the end
    reader.state(COUNT, at=41)                      # ... after the event with seq 41

``App.reader(text)`` does the same with the app's store. Reading takes no lock: it works
while a ``dsh run`` holds the session (it sees the lines written so far; a line being
written — a torn tail — is left out), never writes, never repairs, and needs no provider or
key. A session is read once, when it is opened; the events are kept in memory (a 100,000-event
session takes about as much memory as ``dsh sessions show --json`` of it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from typing import TypeVar

from dsh.core.errors import UsageError
from dsh.core.messages import MessageView
from dsh.ledger.events import Event
from dsh.ledger.events import PluginEvent
from dsh.ledger.history import Projection
from dsh.ledger.plugin_events import EventsView
from dsh.ledger.plugin_events import read as _read_plugin_events

E = TypeVar("E", bound=Event)


def resolve(store: Any, text: str, agent: str | None = None) -> str:
    """A session id from ``text``: a full id, a unique prefix of one, or ``latest`` (the
    newest readable session — of ``agent``, if given — that is not a sub-agent's).

    :raises dsh.core.errors.UsageError: no such session, an ambiguous prefix, no sessions."""
    if not isinstance(text, str) or not text:
        raise UsageError("a session id, a unique prefix of one, or 'latest' is needed")
    if text == "latest":
        for info in newest_sessions(store, agent, roots=True):
            return str(info.id)
        raise UsageError("no sessions yet" + (f" of agent {agent!r}" if agent else ""))
    exists = getattr(store, "exists", None)
    if callable(exists):  # a full id: no listing (and no index) needed
        try:
            if exists(text):
                return text
        except UsageError:  # not an id at all: no prefix of one either (said below)
            pass
    matching = getattr(store, "matching", None)
    matches = (list(matching(text)) if callable(matching)
               else [i for i in store.ids() if i.startswith(text)])
    if text in matches:
        return text
    if len(matches) == 1:
        return str(matches[0])
    if matches:
        raise UsageError(f"session id {text!r} is ambiguous: {', '.join(matches[:5])}")
    raise UsageError(f"no session {text!r} (see dsh sessions list)")


def newest_sessions(store: Any, agent: str | None = None, *, roots: bool = False,
                    on_skip: Any = None) -> Iterator[Any]:
    """``store``'s sessions (of ``agent``; without a parent, with ``roots``), newest first:
    filtered by the built-in store's index, or here for a plugin's store."""
    from dsh.ledger.store import JsonlStore

    if isinstance(store, JsonlStore):
        yield from store.sessions(on_skip, agent=agent, roots=roots)
        return
    if on_skip is None:
        found = store.sessions()
    else:
        try:
            found = store.sessions(on_skip=on_skip)
        except TypeError:  # a plugin's store without on_skip
            found = store.sessions()
    for info in found:
        if (agent is None or info.agent == agent) and not (roots and info.parent):
            yield info


class SessionReader:
    """One stored session, read once: its events, the projection folded from them (history,
    plugin-event index, recorded state). Read-only; holds no lock and no file open."""

    def __init__(self, session_id: str, events: list[Event], path: Path | None = None) -> None:
        self.id = session_id
        self.path = path
        self._events = events
        self._projection: Projection | None = None

    @property
    def projection(self) -> Projection:
        """The projection folded from the events, on first use: an export or a listing that
        only walks the events does not pay for it."""
        if self._projection is None:
            projection = Projection()
            if self.path is not None:  # fragment texts are kept beside the ledger
                from dsh.ledger.fragments import DirectoryBlobs

                projection.blobs = DirectoryBlobs(self.path.parent)
            for event in self._events:
                projection.apply(event)
            self._projection = projection
        return self._projection

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events)

    def events(self, kind: type[E] | str | None = None) -> Iterator[E]:
        """The events, oldest first; only those of class ``kind`` (``TurnStarted``…) or with
        the tag ``kind`` (``"turn/start"``; ``"x/PLUGIN/NAME"``; ``"x"`` for every plugin
        event), if given."""
        for event in self._events:
            if kind is None or (isinstance(kind, type) and isinstance(event, kind)):
                yield event  # type: ignore[misc]
            elif isinstance(kind, str) and (
                    event.type == kind or (isinstance(event, PluginEvent) and event.tag == kind)):
                yield event  # type: ignore[misc]

    @property
    def messages(self) -> MessageView:
        """The model history the session's next request would carry (compactions applied)."""
        return self.projection.view()

    @property
    def system(self) -> str:
        """The system prompt last recorded on ``turn/start``."""
        return self.projection.system

    def plugin_events(self, plugin: str, name: str | None = None) -> EventsView:
        """The events ``x/PLUGIN/…`` (``x/PLUGIN/NAME``), oldest first: an O(1) view."""
        holder: Any = self  # anything with a .projection, as a Ledger has
        return _read_plugin_events(holder, plugin, name)

    def state(self, key: Any, at: int | None = None) -> Any:
        """The value of ``key`` (a :class:`dsh.ledger.state.StateKey`) at the end of the
        session, or after the event with ``seq`` ``at``."""
        return key.read(self.projection, at)

    def states(self) -> list[tuple[str, str, Any]]:
        """Every recorded state in the session: ``(plugin, name, value)`` for the keys built
        in this process (:data:`dsh.ledger.state.KEYS`), in the order they were first
        updated. Plugin events without a key are not state as far as this process knows."""
        from dsh.ledger.state import KEYS

        index = self.projection.plugin_index or {}
        out = []
        for k in index:
            if isinstance(k, tuple) and k in KEYS:
                out.append((k[0], k[1], KEYS[k].read(self.projection)))
        return out

    def __repr__(self) -> str:
        return f"SessionReader({self.id!r}, {len(self._events)} events)"


def open_session(store: Any, text: str = "latest") -> SessionReader:
    """Open the session ``text`` (an id, a unique prefix, ``latest``) of ``store`` — a
    session store (``app.store``, :class:`~dsh.ledger.store.JsonlStore`) or a sessions
    directory — read-only, without a model, a key or the lock.

    :raises dsh.core.errors.UsageError: no such session (named), an ambiguous prefix.
    :raises dsh.core.errors.LedgerError: a ledger that cannot be read (file and line named).
    """
    if isinstance(store, str | Path):
        from dsh.ledger.store import JsonlStore

        store = JsonlStore(Path(store))
    sid = resolve(store, text)
    path = store.path(sid) if hasattr(store, "path") else None
    return SessionReader(sid, store.read(sid), path)


def describe_states(reader: SessionReader) -> str:
    """The recorded state of a session as text (``dsh sessions show``): each known key's
    value, as its ``show`` renders it. Events of a plugin whose key this process does not
    know (a plugin not installed) are opaque: ``sessions show`` lists them as plugin events.
    '' when there is none."""
    import json

    from dsh.ledger.fragments import FragmentMissing
    from dsh.ledger.state import KEYS

    try:
        index = reader.projection.plugin_index or {}
    except FragmentMissing:  # a fragment's blob is gone: sessions show says so once, above
        return ""
    lines = []
    for k, events in index.items():
        if not isinstance(k, tuple):
            continue
        key = KEYS.get(k)
        if key is None:
            continue
        try:
            value = key.read(reader.projection)
        except Exception as exc:  # noqa: BLE001 - shown, never fatal for a reader
            lines.append(f"state {k[0]}/{k[1]}: cannot be folded: {exc}")
            continue
        shown = key.show(value) if key.show is not None else json.dumps(value, ensure_ascii=False)
        lines.append(f"state {k[0]}/{k[1]} ({len(events)} updates):\n{shown}")
    return "\n".join(lines)
