"""Pins for dsh/ledger/plugin_events.py that mutation testing found loose (issue 25): reading
old or foreign lines in ``from_raw``, ``record_event`` in a run without a Session,
``EventsView`` equality, and the distribution cache when the loaded modules change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dsh.core.messages import FrozenDict
from dsh.core.messages import FrozenList
from dsh.host.runcontext import RunContext
from dsh.host.runcontext import activate
from dsh.ledger import plugin_events as pe
from dsh.ledger.events import PluginEvent
from dsh.ledger.serialize import InvalidLine
from dsh.ledger.writer import Ledger

BASE = {"v": 1, "type": "x/p/n", "seq": 3, "ts": "t", "session": "s"}


def test_from_raw_reads_an_old_or_foreign_line_keeping_what_it_does_not_know() -> None:
    e = pe.from_raw({**BASE, "v": 7, "data": {"a": [1, {"b": 2}]}, "future": True})
    assert (e.plugin, e.name, e.seq, e.ts, e.session, e.version) == ("p", "n", 3, "t", "s", 1)
    assert e.extra == {"future": True, "v": 7}  # the schema version is kept, not dropped
    assert type(e.data) is FrozenDict and type(e.data["a"]) is FrozenList
    assert type(e.data["a"][1]) is FrozenDict
    assert pe.from_raw({"type": "x/p/n"}).data == {}  # the least a line can say
    same = pe.from_raw({**BASE, "plugin": "p", "name": "n", "version": 4})
    assert same.version == 4 and same.extra == {}


@pytest.mark.parametrize(("line", "problem"), [
    ({**BASE, "type": "x/p"}, "is not x/PLUGIN/NAME"),
    ({**BASE, "type": "x//n"}, "is not x/PLUGIN/NAME"),
    ({**BASE, "type": "x/p/"}, "is not x/PLUGIN/NAME"),
    ({**BASE, "type": "x/p/n/m"}, "is not x/PLUGIN/NAME"),
    ({**BASE, "plugin": "q"}, "disagree with the tag"),
    ({**BASE, "name": "m"}, "disagree with the tag"),
    ({**BASE, "data": [1]}, "is a list, not an object"),
    ({**BASE, "version": "1"}, "'version' of 'x/p/n' is a str"),
    ({**BASE, "version": True}, "is a bool, not an int"),
    ({**BASE, "seq": "3"}, "has the wrong type"),
    ({**BASE, "ts": 1}, "has the wrong type"),
    ({**BASE, "session": None}, "has the wrong type"),
])
def test_from_raw_refuses_a_wrong_shape_saying_why(line: dict[str, Any], problem: str) -> None:
    with pytest.raises(InvalidLine, match=problem):
        pe.from_raw(line)


def test_from_raw_depth_limit_is_exact() -> None:
    def nested(n: int) -> Any:
        value: Any = 0
        for _ in range(n):
            value = [value]
        return value

    ok = pe.from_raw({**BASE, "data": {"k": nested(pe.MAX_READ_DEPTH - 2)}})
    assert ok.data["k"][0] is not None
    with pytest.raises(InvalidLine, match=f"nests more than {pe.MAX_READ_DEPTH} levels"):
        pe.from_raw({**BASE, "data": {"k": nested(pe.MAX_READ_DEPTH)}})
    # a decoded line is loaded the same through the file path
    line = json.dumps({**BASE, "data": {"k": nested(3)}})
    assert pe.from_raw(json.loads(line)).data == {"k": [[[0]]]}


def test_record_event_in_a_run_without_a_session_writes_to_its_ledger() -> None:
    ledger = Ledger("s1")  # in memory
    ctx = RunContext(run_id="r", agent="a", ledger=ledger)
    with activate(ctx):
        e = pe.record_event("anyname", "n", {"x": 1}, version=2)  # no app: no plugin check
        assert pe.plugin_events("anyname", "n") == [e]
    assert isinstance(e, PluginEvent) and e.version == 2 and e.seq == 0
    assert ledger.projection.plugin_index is not None
    assert list(pe.read(ledger, "anyname")) == [e]


def test_events_view_equality_and_snapshot() -> None:
    ledger = Ledger("s2")
    a = pe.record(ledger, "p", "n", {"i": 1})
    b = pe.record(ledger, "p", "n", {"i": 2})
    view = pe.read(ledger, "p", "n")
    assert view == [a, b] and view == (a, b) and not (view != [a, b])
    assert view != [a] and view != [b, a] and view != [a, b, a]
    assert (view == "ab") is False and (view == 3) is False  # not a sequence of events
    assert view.__eq__("ab") is NotImplemented and view.__eq__(3) is NotImplemented
    c = pe.record(ledger, "p", "n", {"i": 3})
    assert len(view) == 2 and list(view) == [a, b]  # a snapshot: later appends not in it
    # equal, not the same objects: the projection holds the events decoded from the bytes
    # written (issue 23's byte rule), never the objects a caller handed in
    assert view[-1] == b and view[0] == a and view[-2] == a and view[1:] == (b,)
    assert view[-1] != a and view[0] != b
    for bad in (2, -3):
        with pytest.raises(IndexError):
            view[bad]
    assert pe.read(ledger, "p")[-1] == c
    assert pe.read(ledger, "other") == () and pe.read(Ledger("s3"), "p") == []
    with pytest.raises(TypeError):
        hash(view)
    assert repr(pe.read(ledger, "nobody")) == "EventsView([])"


class _App:
    """What _module_dists needs of an app: something weakly referenceable."""


def test_distribution_cache_follows_the_loaded_modules() -> None:
    app = _App()
    first = pe._module_dists(app, frozenset({"pluggy"}))
    assert "pluggy" in first
    assert pe._module_dists(app, frozenset({"pluggy"})) is first  # cached for the same set
    second = pe._module_dists(app, frozenset({"attr"}))
    assert "attrs" in second and "pluggy" not in second  # a changed set is read again
    assert pe._module_dists(app, frozenset()) == frozenset()


def test_is_installed_by_registered_name_dist_or_app(tmp_path: Path) -> None:
    from dsh.run.app import App

    app = App.from_config({"autoload": False, "sessions_dir": str(tmp_path)})
    assert pe.is_installed(app, pe.APP)
    assert pe.is_installed(app, "dsh.tasks")  # a built-in, by its registered name
    assert not pe.is_installed(app, "nosuch-plugin")
