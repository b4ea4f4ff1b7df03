"""A plugin's own persistent events: ``x/PLUGIN/NAME`` lines in the session ledger (issue 11).

A plugin keeps per-session state in the ledger itself instead of a side file::

    from dsh.ledger.plugin_events import plugin_events, record_event

    record_event("myplugin", "counted", {"requests": 3})       # inside a run
    last = plugin_events("myplugin", "counted")[-1].data        # also after a resume

Library code holding a :class:`dsh.run.session.Session` uses ``Session.record_event`` /
``Session.plugin_events``. Everything written here is checked hard before it reaches the
ledger (docs/events.md, "Plugin events"):

* names: ``PLUGIN`` and ``NAME`` match :data:`NAME_RE` (letters, digits, ``._-``, at most
  64 characters, no ``/``); ``PLUGIN`` must be a plugin of this app — its registered name
  (``hooks``, ``dsh.compaction``) or its distribution's (``dsh-hooks``) — or :data:`APP`,
  the namespace of the application embedding dsh. A plugin records only under its own name:
  while a plugin's code runs (one of its hooks, or a tool it registered), ``PLUGIN`` must be
  that plugin's registered or distribution name (:func:`owner_problem`); library code may
  write for any plugin of the app;
* ``data``: a JSON object — ``str`` keys; values ``None``, ``bool``, ``int`` within 64 bits,
  finite ``float``, ``str`` without lone surrogates, lists/tuples and objects, nested at most
  :data:`MAX_DEPTH` deep — of at most :data:`MAX_DATA_BYTES` as written; strings go through
  :func:`dsh.core.redact.redact`, like every diagnostic dsh records (a key that holds a secret
  is refused). Anything else raises :class:`PluginEventError` naming the plugin, the event
  and the key;
* reading is an index kept by the ledger's projection as events are appended or loaded: no
  file is read again, and a session without plugin events pays nothing for it.

Plugin events never reach a model by themselves: the projection into model messages ignores
them. To show one to the model, inject it as context (``step.context.append(...)`` in
``pre_step``, or ``Session.inject``): that is recorded as ``context/injected`` first (C3).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any
from typing import overload

from dsh.core.errors import LedgerError
from dsh.core.errors import NoRunContext
from dsh.core.errors import UsageError
from dsh.core.messages import FrozenDict
from dsh.core.messages import FrozenList
from dsh.ledger.events import SCHEMA_VERSION
from dsh.ledger.events import PluginEvent
from dsh.ledger.owners import APP
from dsh.ledger.owners import is_installed
from dsh.ledger.owners import owner_problem
from dsh.ledger.serialize import InvalidLine

if TYPE_CHECKING:
    from dsh.ledger.writer import Ledger
    from dsh.run.app import App

#: A plugin or event name: letters, digits, ``.``, ``_``, ``-``; starts with a letter or digit.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
MAX_NAME = 64
#: The largest ``data`` object, in bytes of its JSON text (UTF-8).
MAX_DATA_BYTES = 64 * 1024
#: How deep lists and objects may nest inside ``data``.
MAX_DEPTH = 32
#: How deep a payload read from a ledger may nest (lenient: dsh writes at most MAX_DEPTH).
MAX_READ_DEPTH = 128
#: Integers are kept within 64 bits (what most JSON readers can hold exactly).
INT_RANGE = (-(2**63), 2**63 - 1)
#: The largest payload schema version.
MAX_VERSION = 2**31 - 1

_SURROGATE = re.compile("[\ud800-\udfff]")
_FIELDS = frozenset({"v", "type", "seq", "ts", "session", "plugin", "name", "data", "version"})


class PluginEventError(UsageError, ValueError):
    """A plugin event that cannot be recorded: a bad name, or data that is not a JSON object
    dsh can write and read back exactly. The message names the plugin, the event and the
    key."""


class OutsideRun(NoRunContext, RuntimeError):
    """:func:`record_event` / :func:`plugin_events` called outside a run."""


# ------------------------------------------------------------------------------ checking


def check_name(value: Any, what: str) -> str:
    """``value`` if it is a valid plugin or event name, else :class:`PluginEventError`."""
    if type(value) is not str or not NAME_RE.match(value):
        shown = repr(value) if not isinstance(value, str) or len(value) <= 80 else \
            repr(value[:77] + "...")
        raise PluginEventError(
            f"invalid plugin event {what} {shown}: use 1-{MAX_NAME} letters, digits, '.', "
            "'_' or '-', starting with a letter or digit")
    return value


def _where(path: str) -> str:
    return f"data{path}" if path else "data"


def clean_data(plugin: str, name: str, data: Any) -> dict[str, Any]:
    """``data`` as it will be recorded: checked, tuples made lists, strings redacted.
    Raises :class:`PluginEventError` naming the plugin, event and key for anything else."""
    from dsh.core.redact import redact

    event = f"plugin event x/{plugin}/{name}"
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise PluginEventError(f"{event}: data must be a JSON object (a dict), "
                               f"not {type(data).__name__}")
    # Stops the walk early on huge data. Each value spends at most what it adds to the JSON
    # text (objects' braces are not counted), so data within the limit is never refused by
    # it; the exact size is checked at the end.
    budget = [MAX_DATA_BYTES]
    # Redaction costs ~15 us a string: the first pass collects the strings and one call on
    # all of them at once (joined by newlines, which no pattern crosses) tells whether any
    # needs it; only then does a second pass redact them one by one.
    strings: list[str] | None = []

    def fail(path: str, problem: str) -> PluginEventError:
        return PluginEventError(f"{event}: {_where(path)} {problem}")

    def spend(n: int, path: str) -> None:
        budget[0] -= n
        if budget[0] < 0:
            raise fail(path, f"makes the event larger than {MAX_DATA_BYTES} bytes")

    def text(s: str, path: str, key: bool = False) -> str:
        if type(s) is not str:
            s = str.__str__(s)
        m = _SURROGATE.search(s)
        if m is not None:
            what = "key" if key else "string"
            raise fail(path, f"is a {what} with a lone surrogate (U+{ord(m.group()):04X} at "
                       f"index {m.start()}): not valid Unicode, cannot be written as UTF-8")
        spend(len(s) + 3, path)
        return s

    def walk(value: Any, path: str, depth: int) -> Any:
        if value is None or value is True or value is False:
            spend(5, path)
            return value
        if isinstance(value, str):
            value = text(value, path)
            if strings is None:
                return redact(value)
            strings.append(value)
            return value
        # (bool cannot be subclassed: True and False were taken above)
        if isinstance(value, int):
            # the number itself: a subclass's __int__ or __index__ is not asked
            value = int.__int__(value)
            if not INT_RANGE[0] <= value <= INT_RANGE[1]:
                raise fail(path, f"is an integer outside 64 bits ({str(value)[:20]}...): "
                           "write it as a string")
            spend(len(str(value)) + 1, path)  # as written, with its comma: never more
            return value
        if isinstance(value, float):
            value = float.__float__(value)  # the number itself, not a subclass's __float__
            if not math.isfinite(value):
                raise fail(path, f"is {value!r}, which JSON cannot represent")
            spend(len(repr(value)) + 1, path)
            return value
        if depth >= MAX_DEPTH:
            raise fail(path, f"nests deeper than {MAX_DEPTH} levels")
        if isinstance(value, Mapping):
            out: dict[str, Any] = {}
            for k, v in value.items():
                sub = f"{path}[{k!r}]"
                if not isinstance(k, str):
                    raise fail(sub, f"has a key of type {type(k).__name__}: JSON object keys are "
                               "strings")
                k = text(k, sub, key=True)
                if strings is not None:
                    strings.append(k)
                elif redact(k) != k:
                    raise fail(sub, "has a key that looks like a secret (dsh.core.redact would "
                               "hide it): keys are names, put values in values")
                out[k] = walk(v, sub, depth + 1)
            return out
        if isinstance(value, list | tuple):
            spend(2, path)
            return [walk(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
        raise fail(path, f"is a {type(value).__name__}, which is not JSON (use objects, lists, "
                   "strings, numbers, booleans and null)")

    clean: dict[str, Any] = walk(data, "", 0)
    joined = "\n".join(strings or ())
    if strings and redact(joined) != joined:
        strings, budget[0] = None, MAX_DATA_BYTES
        clean = walk(data, "", 0)
    size = len(json.dumps(clean, ensure_ascii=False, separators=(",", ":")).encode())
    if size > MAX_DATA_BYTES:
        raise PluginEventError(f"{event}: data is {size} bytes as JSON; the limit is "
                               f"{MAX_DATA_BYTES}")
    return clean


def check_version(plugin: str, name: str, version: Any) -> int:
    if type(version) is not int or not 1 <= version <= MAX_VERSION:
        raise PluginEventError(f"plugin event x/{plugin}/{name}: version must be an int from "
                               f"1 to {MAX_VERSION}, not {version!r}")
    return version


# ------------------------------------------------------------------------ writing, reading


def record(ledger: Ledger, plugin: str, name: str, data: Mapping[str, Any] | None = None, *,
           version: int = 1, app: App | None = None, pm: Any = None,
           durable: bool = False) -> PluginEvent:
    """Check and append one plugin event to ``ledger``; return it as recorded.

    :param app: when given, ``plugin`` must be one of its plugins (:func:`is_installed`),
        and, when a plugin's code is recording, that plugin's own (:func:`owner_problem`).
    :param durable: make it durable now (per the ledger's fsync policy), as a step boundary
        does: for an event written outside a run.
    """
    check_name(plugin, "plugin name")
    check_name(name, "name")
    check_version(plugin, name, version)
    if app is not None and not is_installed(app, plugin, pm):
        raise PluginEventError(
            f"plugin event x/{plugin}/{name}: no plugin {plugin!r} is registered in this app "
            f"(use a plugin's registered or distribution name, or {APP!r} for the "
            "application itself)")
    if app is not None:
        problem = owner_problem(app, pm, plugin, f"plugin event x/{plugin}/{name}")
        if problem is not None:
            raise PluginEventError(problem)
    clean = clean_data(plugin, name, data)
    event = ledger.append(PluginEvent, plugin=plugin, name=name, data=clean, version=version)
    if durable:
        ledger.step_boundary()
    return event


class EventsView(Sequence[PluginEvent]):
    """A read-only view of the first ``n`` events of an index list (append-only): taking one
    is O(1) however many events the plugin wrote, so reading the latest at every step keeps
    the step's cost flat. Later appends are not in it (a snapshot). Compares equal to any
    sequence of the same events (``== ()`` when empty)."""

    __slots__ = ("_items", "_n")

    def __init__(self, items: list[PluginEvent]) -> None:
        self._items = items
        self._n = len(items)

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> PluginEvent: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[PluginEvent]: ...

    def __getitem__(self, index: int | slice) -> PluginEvent | Sequence[PluginEvent]:
        if isinstance(index, slice):
            return tuple(self._items[: self._n][index])
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError("plugin event index out of range")
        return self._items[index]

    def __iter__(self) -> Iterator[PluginEvent]:
        items = self._items
        for i in range(self._n):
            yield items[i]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(other) == self._n and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"EventsView({list(self)!r})"


_EMPTY: list[PluginEvent] = []


def read(ledger: Ledger, plugin: str, name: str | None = None) -> EventsView:
    """The events of ``plugin`` (only those called ``name``, if given) in ``ledger``, oldest
    first, from the projection's index: an O(1) read-only view."""
    check_name(plugin, "plugin name")
    if name is not None:
        check_name(name, "name")
    index = ledger.projection.plugin_index
    if index is None:
        return EventsView(_EMPTY)
    return EventsView(index.get(plugin if name is None else (plugin, name), _EMPTY))


def _current() -> Any:
    from dsh.host.runcontext import current_or_none

    ctx = current_or_none()
    if ctx is None:
        raise OutsideRun(
            "dsh.ledger.plugin_events: record_event/plugin_events act on the current run's session "
            "and were called outside a run; from library code use Session.record_event / "
            "Session.plugin_events")
    return ctx


def record_event(plugin: str, name: str, data: Mapping[str, Any] | None = None, *,
                 version: int = 1) -> PluginEvent:
    """Append the plugin event ``x/PLUGIN/NAME`` with ``data`` to the current run's session.

    :param plugin: your plugin's registered name (or its distribution's name).
    :param name: the event's name within your plugin.
    :param data: a JSON object (see the module's docstring for what is accepted).
    :param version: your schema version of ``data`` (readers use it to migrate old events).
    :raises OutsideRun: (a ``RuntimeError``) outside a run.
    :raises PluginEventError: (a ``ValueError``) for a bad name or bad data.
    """
    ctx = _current()
    session = getattr(ctx, "session", None)
    if session is not None:
        result: PluginEvent = session.record_event(plugin, name, data, version=version)
        return result
    # A RunContext built by hand, without a Session: no app to check the plugin against.
    return record(ctx.ledger, plugin, name, data, version=version)


def plugin_events(plugin: str, name: str | None = None) -> EventsView:
    """The events ``x/PLUGIN/…`` (or ``x/PLUGIN/NAME``) of the current run's session, oldest
    first — including those written before a restart — as an O(1) read-only sequence
    (``plugin_events(P, N)[-1]`` is the latest). ``event.data`` is read-only
    (:func:`dsh.core.messages.thaw` gives a copy to change).

    :raises OutsideRun: (a ``RuntimeError``) outside a run.
    """
    return read(_current().ledger, plugin, name)


# ------------------------------------------------------------------------------- loading


def from_raw(d: dict[str, Any]) -> PluginEvent:
    """A ledger line's object as a :class:`PluginEvent`. Reading is lenient about what dsh
    would refuse to write (a payload is kept as it is) but strict about the shape: the tag
    must be ``x/PLUGIN/NAME`` with ``plugin`` and ``name`` (when present) agreeing with it,
    ``data`` an object nested at most :data:`MAX_READ_DEPTH` deep and ``version`` an int.
    Anything else raises :class:`~dsh.ledger.serialize.InvalidLine` with the reason."""
    checked_raw(d)
    return from_checked(d)


def checked_raw(d: dict[str, Any], line: str | None = None) -> tuple[str, str]:
    """``(plugin, name)`` of a ledger line :func:`from_raw` takes: every check of it made, the
    event not built; :func:`from_checked` builds it later from the same object. ``line``, the
    text ``d`` was decoded from, if known: one with few brackets is not walked for depth."""
    tag = d["type"]
    parts = _TAGS.get(tag)
    if parts is None:
        split = tag.split("/")
        if len(split) != 3 or not split[1] or not split[2]:
            raise InvalidLine(f"plugin event tag {tag!r} is not x/PLUGIN/NAME")
        parts = (split[1], split[2])
        if len(_TAGS) < 1024 and len(tag) <= _MAX_TAG:  # a hand-made long tag: not kept
            _TAGS[tag] = parts
    plugin = d.get("plugin", parts[0])
    name = d.get("name", parts[1])
    if plugin != parts[0] or name != parts[1]:
        raise InvalidLine(f"'plugin'/'name' ({plugin!r}, {name!r}) disagree with the tag {tag!r}")
    data = d.get("data", {})
    if type(data) is not dict:
        raise InvalidLine(f"'data' of {tag!r} is a {type(data).__name__}, not an object")
    if "version" in d and type(d["version"]) is not int:
        raise InvalidLine(f"'version' of {tag!r} is a {type(d['version']).__name__}, "
                          "not an int")
    if (type(d.get("seq", 0)) is not int or type(d.get("ts", "")) is not str  # absent: see
            or type(d.get("session", "")) is not str):  # from_raw
        raise InvalidLine(f"'seq', 'ts' or 'session' of {tag!r} has the wrong type")
    # Each level of nesting opens with a bracket of its own, and the line's object is one
    # more: a line with at most MAX_READ_DEPTH + 1 (in strings too) cannot nest too deeply.
    if (line is None or line.count("{") + line.count("[") > MAX_READ_DEPTH + 1) \
            and not _shallow(data, 0):
        raise InvalidLine(f"'data' of {tag!r} nests more than {MAX_READ_DEPTH} levels deep")
    return parts


#: Tags already found well-formed: ``tag -> (plugin, name)``, for the life of the process:
#: bounded in number, and only tags as long as dsh writes them (``x/`` and two names).
_TAGS: dict[str, tuple[str, str]] = {}
_MAX_TAG = 3 + 2 * MAX_NAME


def from_checked(d: dict[str, Any]) -> PluginEvent:
    """The event of a line :func:`checked_raw` took (its ``data`` is frozen in place: the
    object must be the decoder's own, which nobody else holds)."""
    extra = {k: v for k, v in d.items() if k not in _FIELDS}
    if d.get("v", SCHEMA_VERSION) != SCHEMA_VERSION:
        extra["v"] = d["v"]
    _, plugin, name = d["type"].split("/")
    return PluginEvent(seq=d.get("seq", 0), ts=d.get("ts", ""), session=d.get("session", ""),
                       plugin=plugin, name=name, data=_frozen_json(d.get("data", {})),
                       version=d.get("version", 1), extra=extra)


def _frozen_json(value: Any) -> Any:
    """``freeze`` for what ``json.loads`` made (exact dicts, lists and scalars only; its depth
    checked before): one pass, no ABC checks. ``value`` is a fresh object of the decoder's:
    nested containers are replaced in place, then it is copied once into its frozen type."""
    if type(value) is dict:
        for k, v in value.items():
            if type(v) in _NESTED:
                value[k] = _frozen_json(v)
        return FrozenDict(value)
    for i, v in enumerate(value):
        if type(v) in _NESTED:
            value[i] = _frozen_json(v)
    return FrozenList(value)


_NESTED = (dict, list)


def _shallow(value: Any, depth: int) -> bool:
    """Whether ``value`` (a decoded object or list at ``depth``) nests at most
    :data:`MAX_READ_DEPTH` deep, ``data`` itself the first level. Not
    :func:`dsh.core.sanitize.nesting_depth`, which takes any value (tuples, dict subclasses)
    however deep without recursing: this one sees only what the decoder made, recurses at
    most ``MAX_READ_DEPTH`` levels, and is ~3x faster on the load path (every ``x/`` line)."""
    if depth >= MAX_READ_DEPTH:
        return False
    for v in value.values() if type(value) is dict else value:
        if type(v) in _NESTED and not _shallow(v, depth + 1):
            return False
    return True


def load(d: dict[str, Any], where: str) -> PluginEvent:
    """:func:`from_raw`, its problems as a :class:`~dsh.core.errors.LedgerError` at ``where``."""
    try:
        return from_raw(d)
    except InvalidLine as exc:
        raise LedgerError(f"{where}: invalid plugin event: {exc}") from None
