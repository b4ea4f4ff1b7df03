"""Typed per-plugin storage, as pytest's ``config.stash`` (issue 11).

A plugin makes a key once, at module level, and keeps its state in the stash of the scope it
needs — the app, the agent, the session or the run (see :class:`dsh.host.scope.AgentHandle`)::

    COUNT = dsh.StashKey[int]()

    @dsh.hookimpl
    def pre_step(step):
        stash = step.handle.session_stash
        stash[COUNT] = stash.get(COUNT, 0) + 1

Keys are compared by identity, so two plugins can never clash, even with the same names.
"""

from __future__ import annotations

from typing import Generic
from typing import TypeVar
from typing import cast

__all__ = ["Stash", "StashKey"]

T = TypeVar("T")
D = TypeVar("D")


class StashKey(Generic[T]):
    """A key of a :class:`Stash`, typed by what it stores: ``StashKey[int]()``. Make it once
    (module level) and reuse it: a key is equal only to itself."""

    __slots__ = ()


class Stash:
    """A typed map from :class:`StashKey` to values, one per scope: ``stash[key] = value``,
    ``stash[key]`` (:class:`KeyError` when unset), ``stash.get(key, default)``,
    ``stash.setdefault(key, default)``, ``key in stash``, ``del stash[key]``, ``len(stash)``.

    Thread-safety: each single operation — ``stash[key]``, ``stash[key] = v``, ``del
    stash[key]``, :meth:`get`, :meth:`setdefault`, ``key in stash`` — is atomic, so
    concurrent tool calls of one step may use the same stash. A read-modify-write
    (``stash[key] = stash.get(key, 0) + 1``) is *not* atomic across threads: store a
    container once with :meth:`setdefault` and guard it with your own lock (or use
    ``itertools.count``, whose ``next()`` is atomic), as tests/test_plugin_api.py does.
    """

    __slots__ = ("_data",)

    def __init__(self) -> None:
        # A plain dict: its single operations hold the GIL throughout for keys hashed by
        # identity (StashKey defines no __hash__/__eq__), which is what makes them atomic.
        self._data: dict[StashKey[object], object] = {}

    def __setitem__(self, key: StashKey[T], value: T) -> None:
        self._data[cast("StashKey[object]", key)] = value

    def __getitem__(self, key: StashKey[T]) -> T:
        """The value stored under ``key``; :class:`KeyError` if there is none."""
        return cast(T, self._data[cast("StashKey[object]", key)])

    def get(self, key: StashKey[T], default: D) -> T | D:
        """The value stored under ``key``, or ``default``."""
        return cast("T | D", self._data.get(cast("StashKey[object]", key), default))

    def setdefault(self, key: StashKey[T], default: T) -> T:
        """The value stored under ``key``; when there is none, store ``default`` and return
        it (atomically: of two threads, both get the value stored first)."""
        return cast(T, self._data.setdefault(cast("StashKey[object]", key), default))

    def __delitem__(self, key: StashKey[T]) -> None:
        del self._data[cast("StashKey[object]", key)]

    def __contains__(self, key: StashKey[T]) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"<Stash: {len(self._data)} key(s)>"
