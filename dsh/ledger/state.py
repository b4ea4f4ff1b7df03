"""Recorded state: typed values that are a fold over plugin events (issue 25, MISSION D4).

A plugin's state that must survive a resume — a task list, remembered facts, a counter — is
not a Python object that dies with a :class:`~dsh.run.session.Session` but a *fold* over the
plugin's own events in the ledger::

    from dsh import StateKey      # (this module is private: import the names from dsh)

    def count(state: int, data: Mapping[str, Any]) -> int:      # pure: no I/O, no mutation
        return state + int(data.get("by", 1))

    COUNT = StateKey("warden", "count", 0, count)

    COUNT.update({"by": 1})        # inside a run: records x/warden/count {"by": 1}
    COUNT.get()                    # the current value, also after `dsh run --session ID`

* **Every change is an event.** :meth:`StateKey.update` runs the reducer on the current value
  first — a reducer that raises, or returns what is not JSON, records nothing and raises
  :class:`StateError` naming the plugin and key — then appends ``x/PLUGIN/NAME`` with the
  update as its ``data`` (checked and redacted like every plugin event). The read and the
  append happen under the ledger's lock: updates from parallel tool calls are never lost,
  and the state follows the order of the lines in the ledger.
* **The projection folds it.** The value is computed from the projection's plugin-event index
  (:attr:`dsh.ledger.history.Projection.plugin_index`) and cached on the projection as
  ``(events folded, value)``: a read folds only the events appended since the last one, so
  resuming folds each event once (O(events)) and each new event costs one reducer call. A
  compaction replaces messages, never plugin events: the state survives it.
* **Values are frozen JSON.** The reducer gets the state and the update read-only
  (:class:`~dsh.core.messages.FrozenDict` / ``FrozenList``; mutating them raises, reported
  as a :class:`StateError`); what it returns must be JSON (``None``, bool, int, finite float,
  str, lists and objects with string keys) and is frozen in turn. A value larger than
  ``max_bytes`` as JSON is refused when it is updated.
* **Never model-visible by itself.** Nothing here reaches a request. A plugin shows state to
  the model through a recorded route: a ``turn_prompt`` fragment (recorded on ``turn/start``
  as part of the system prompt) or injected context (``context/injected``), so the next
  request is always reconstructible from the ledger alone (C3).
* **A key is a plugin's own.** Only the plugin that owns a key updates it: an update made
  while another plugin's code runs (its hook, or a tool it registered) is refused with a
  :class:`StateError` naming both plugins, so plugin X cannot shape ``dsh.memory``'s part of
  the next prompt. Events of a plugin that is not installed are kept as they are (``dsh
  sessions show`` marks them); without its :class:`StateKey` their state is opaque.

A ``{"$state": VALUE}`` update sets the value without calling the reducer: what
``App.parallel`` records into each child session so that it starts from a frozen copy of the
parent's state (D6).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any
from typing import Generic
from typing import TypeVar

from dsh.core.errors import PluginError
from dsh.core.messages import FrozenDict
from dsh.core.messages import FrozenList
from dsh.core.messages import freeze
from dsh.ledger.events import PluginEvent
from dsh.ledger.plugin_events import MAX_DEPTH
from dsh.ledger.plugin_events import check_name
from dsh.ledger.plugin_events import check_version
from dsh.ledger.plugin_events import clean_data
from dsh.ledger.plugin_events import is_installed
from dsh.ledger.plugin_events import owner_problem

T = TypeVar("T")

#: The default largest state value, in bytes of its JSON text (checked at each update).
MAX_STATE_BYTES = 256 * 1024
#: The update that sets a value without the reducer (a fork's frozen copy, D6).
SET = "$state"

#: Every key built in this process, by ``(plugin, name)``: what ``dsh sessions show`` and
#: :class:`dsh.ledger.reader.SessionReader` can show decoded; other state events are opaque.
KEYS: dict[tuple[str, str], StateKey[Any]] = {}


class StateError(PluginError, ValueError):
    """A reducer that raised, returned what is not JSON or too large, or a bad update. The
    message names the plugin, the key and, when folding a recorded event, its ``seq``.

    :attr:`reducer_error` is the exception the reducer itself raised (the same object as
    ``__cause__``), for a plugin that catches its own error type::

        try:
            TASKS.update({"op": "done", "id": 7})
        except dsh.StateError as err:
            if isinstance(err.reducer_error, KeyError):   # the reducer's own "no task 7"
                raise dsh.ToolError(f"no task {err.reducer_error}") from None
            raise

    It is None when dsh refused the value (not JSON, too large, not the key's owner).
    """

    def __init__(self, message: str, *, plugin: str = "", hook: str = "",
                 reducer_error: BaseException | None = None) -> None:
        super().__init__(message, plugin=plugin, hook=hook)
        #: The exception the reducer raised, or None when the reducer did not raise.
        self.reducer_error = reducer_error


class StateKey(Generic[T]):
    """One piece of recorded state: the events ``x/PLUGIN/NAME`` folded by ``reduce``.

    :param plugin: the plugin that owns it (its registered or distribution name, or ``app``).
    :param name: the event name its updates are recorded under.
    :param initial: the value before any update (JSON; frozen).
    :param reduce: ``reduce(state, data) -> new state``, pure: the same inputs always give
        the same value, no I/O, no mutation of its arguments (they are read-only). It is
        called once per event per process — at the update and when a resumed session is first
        read — never again for the same event.
    :param max_bytes: the largest value, as JSON, an update may produce.
    :param version: the ``version`` recorded with each update (your schema of ``data``).
    :param show: ``show(value) -> str``, how ``dsh sessions show`` prints the value (default:
        its JSON).
    :param replaces: each update gives the whole new value: ``reduce`` ignores the state it
        is given (a task list written whole). A read then folds only the newest update it
        has not folded, so a resumed session with 10,000 updates costs one reducer call, not
        10,000; an earlier update the reducer would refuse is then not reported (it no
        longer shapes the value). Say it only of such a reducer: with one that uses the
        state, the value would differ from the full fold.
    """

    __slots__ = ("plugin", "name", "initial", "reduce", "max_bytes", "version", "show",
                 "replaces")

    def __init__(self, plugin: str, name: str, initial: T,
                 reduce: Callable[[T, Mapping[str, Any]], T], *,
                 max_bytes: int = MAX_STATE_BYTES, version: int = 1,
                 show: Callable[[T], str] | None = None, replaces: bool = False) -> None:
        self.plugin = check_name(plugin, "plugin name")
        self.name = check_name(name, "name")
        self.version = check_version(plugin, name, version)
        if not callable(reduce):
            raise StateError(f"state {plugin}/{name}: reduce must be callable, not "
                             f"{type(reduce).__name__}", plugin=plugin)
        if show is not None and not callable(show):
            raise StateError(f"state {plugin}/{name}: show must be callable or None, not "
                             f"{type(show).__name__}", plugin=plugin)
        if type(max_bytes) is not int or max_bytes < 1:
            raise StateError(f"state {plugin}/{name}: max_bytes must be a positive int, not "
                             f"{max_bytes!r}", plugin=plugin)
        self.reduce = reduce
        self.max_bytes = max_bytes
        self.show = show
        self.replaces = bool(replaces)
        self.initial: T = frozen_json(initial, f"state {plugin}/{name}: the initial value",
                                      plugin)
        KEYS[(self.plugin, self.name)] = self

    def __repr__(self) -> str:
        return f"StateKey({self.plugin!r}, {self.name!r})"

    # --------------------------------------------------------------------------- reading

    def read(self, projection: Any, at: int | None = None) -> T:
        """The value in ``projection`` (a :class:`~dsh.ledger.history.Projection`): folded
        incrementally and cached on it. With ``at``, the value after the events with
        ``seq <= at`` (not cached: O(events of this key))."""
        index = projection.plugin_index
        events = index.get((self.plugin, self.name)) if index is not None else None
        if not events:
            return self.initial
        if at is not None:
            value = self.initial
            upto = [event for event in events if event.seq <= at]
            for event in upto[-1:] if self.replaces else upto:
                value = self._fold(value, event)
            return value
        cache = projection.states
        if cache is None:
            cache = projection.states = {}
        done, value = cache.get(self, (0, self.initial))
        n = len(events)
        if done < n:
            if self.replaces:  # only the newest update shapes the value
                done = n - 1
            for i in range(done, n):
                value = self._fold(value, events[i])
            cache[self] = (n, value)  # one assignment: a concurrent reader sees old or new
        return value

    def _fold(self, value: T, event: PluginEvent) -> T:
        where = f"state {self.plugin}/{self.name} (event seq {event.seq})"
        return self._apply(value, event.data, where)

    def _apply(self, value: T, data: Mapping[str, Any], where: str) -> T:
        if len(data) == 1 and SET in data:
            return frozen_json(data[SET], where, self.plugin)
        try:
            new = self.reduce(value, data)
        except Exception as exc:
            hint = " (the state is read-only: return a new value)" \
                if isinstance(exc, TypeError) and "read-only" in str(exc) else ""
            raise StateError(f"{where}: the reducer raised {type(exc).__name__}: {exc}{hint}",
                             plugin=self.plugin, reducer_error=exc) from exc
        return frozen_json(new, f"{where}: the reducer returned a value that", self.plugin)

    def get(self) -> T:
        """The value in the current run's session (written before a restart included).

        :raises dsh.ledger.plugin_events.OutsideRun: outside a run."""
        from dsh.ledger.plugin_events import _current

        return self.read(_current().ledger.projection)

    # --------------------------------------------------------------------------- writing

    def apply(self, ledger: Any, data: Mapping[str, Any] | None = None, *, app: Any = None,
              pm: Any = None) -> T:
        """Record ``data`` as an update in ``ledger`` and return the new value.

        The reducer runs first, under the ledger's lock, on the value that includes every
        earlier update; only if it succeeds (and its value is JSON within ``max_bytes``) is
        the event appended. With ``app``, the plugin must be one of its plugins, and the
        plugin whose code is running must be that one (a plugin updates only its own keys:
        :func:`dsh.ledger.plugin_events.owner_problem`)."""
        event = f"x/{self.plugin}/{self.name}"
        if app is not None and not is_installed(app, self.plugin, pm):
            raise StateError(f"state {event}: no plugin {self.plugin!r} is registered in this "
                             "app", plugin=self.plugin)
        if app is not None:
            problem = owner_problem(app, pm, self.plugin, f"state {event}")
            if problem is not None:
                raise StateError(problem, plugin=self.plugin)
        clean = clean_data(self.plugin, self.name, data)
        with ledger._lock:
            current = self.read(ledger.projection)
            new = self._apply(current, freeze(clean), f"state {self.plugin}/{self.name}")
            try:  # frozen containers are trusted by frozen_json: freeze() keeps other objects
                text = json.dumps(new, ensure_ascii=False, separators=(",", ":"),
                                  allow_nan=False)
            except (TypeError, ValueError, RecursionError) as exc:
                raise StateError(f"state {self.plugin}/{self.name}: the reducer returned a "
                                 f"value that is not JSON ({exc})", plugin=self.plugin) from exc
            size = len(text.encode())
            if size > self.max_bytes:
                raise StateError(
                    f"state {self.plugin}/{self.name}: the update makes the value {size} bytes "
                    f"as JSON; the limit is {self.max_bytes} (nothing was recorded)",
                    plugin=self.plugin)
            before = len(ledger.projection.plugin_index.get((self.plugin, self.name), ())) \
                if ledger.projection.plugin_index is not None else 0
            ledger.append(PluginEvent, plugin=self.plugin, name=self.name, data=clean,
                          version=self.version)
            states = ledger.projection.states
            if states is None:
                states = ledger.projection.states = {}
            states[self] = (before + 1, new)
        return new

    def update(self, data: Mapping[str, Any] | None = None) -> T:
        """Record an update in the current run's session and return the new value.

        The returned value is the reducer's result for *this* update, computed under the
        ledger's lock on a value that includes every earlier update (also those of tool calls
        running in parallel): use it rather than calling :meth:`get` afterwards, which may
        already include a later update of another call.

        :raises dsh.OutsideRun: outside a run (use ``Session.update_state`` from library
            code).
        :raises dsh.StateError: the reducer raised (:attr:`StateError.reducer_error`) or
            returned what cannot be kept; nothing was recorded.
        :raises dsh.PluginEventError: ``data`` is not a JSON object."""
        from dsh.ledger.plugin_events import _current

        ctx = _current()
        session = getattr(ctx, "session", None)
        if session is not None:
            result: T = session.update_state(self, data)
            return result
        return self.apply(ctx.ledger, data)


def frozen_json(value: Any, where: str, plugin: str = "") -> Any:
    """``value`` frozen, if it is JSON (nested at most MAX_DEPTH); else :class:`StateError`
    saying what is not. Frozen containers are trusted as they are (O(1))."""
    t = type(value)
    if t is FrozenDict or t is FrozenList or t is str or t is int or t is bool or value is None:
        return value  # the common case (a reducer returning recorded data): nothing to build

    def fail(path: str, problem: str) -> StateError:
        at = f" at {path}" if path else ""
        return StateError(f"{where}{at} {problem}", plugin=plugin)

    def walk(v: Any, path: str, depth: int) -> Any:
        t = type(v)
        if v is None or t is bool or t is str or t is FrozenDict or t is FrozenList:
            return v
        if t is int:
            return v
        if t is float:
            if not math.isfinite(v):
                raise fail(path, f"is {v!r}, which JSON cannot represent")
            return v
        if depth >= MAX_DEPTH:
            raise fail(path, f"nests deeper than {MAX_DEPTH} levels")
        if t is dict:
            out = {}
            for k, item in v.items():
                if type(k) is not str:
                    raise fail(f"{path}[{k!r}]", f"has a key of type {type(k).__name__}")
                out[k] = walk(item, f"{path}[{k!r}]", depth + 1)
            return FrozenDict(out)
        if t is list or t is tuple:
            return FrozenList(walk(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(v))
        raise fail(path, f"is a {t.__name__}, not JSON (use None, bool, int, float, str, "
                   "lists and dicts)")

    return walk(value, "", 0)
