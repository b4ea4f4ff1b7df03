"""Pins for dsh/ledger/plugin_events.py that mutation testing found loose (issue 25): reading
old or foreign lines in ``from_raw``, ``record_event`` in a run without a Session,
``EventsView`` equality, and the distribution cache when the loaded modules change."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.core.messages import FrozenDict
from dsh.core.messages import FrozenList
from dsh.core.messages import thaw
from dsh.host.runcontext import RunContext
from dsh.host.runcontext import activate
from dsh.ledger import owners
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
    least = pe.from_raw({"type": "x/p/n"})  # the least a line can say
    assert (least.data, least.seq, least.ts, least.session, least.version, least.extra) \
        == ({}, 0, "", "", 1, {})
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
    with pytest.raises(InvalidLine) as err:
        pe.from_raw({**BASE, "data": {"k": nested(pe.MAX_READ_DEPTH)}})
    assert str(err.value) == f"'data' of 'x/p/n' nests more than {pe.MAX_READ_DEPTH} levels deep"
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
    first = owners._module_dists(app, frozenset({"pluggy"}))
    assert "pluggy" in first
    assert owners._module_dists(app, frozenset({"pluggy"})) is first  # cached for the same set
    second = owners._module_dists(app, frozenset({"attr"}))
    assert "attrs" in second and "pluggy" not in second  # a changed set is read again
    assert owners._module_dists(app, frozenset()) == frozenset()


def test_is_installed_by_registered_name_dist_or_app(tmp_path: Path) -> None:
    from dsh.run.app import App

    app = App.from_config({"autoload": False, "sessions_dir": str(tmp_path)})
    assert pe.is_installed(app, pe.APP)
    assert pe.is_installed(app, "dsh.tasks")  # a built-in, by its registered name
    assert not pe.is_installed(app, "nosuch-plugin")


# --------------------------------------------------- the size limit is the size as written

LIMIT = pe.MAX_DATA_BYTES


def _size(data: Any) -> int:
    return len(json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode())


def _padded(data: dict[str, Any], extra: int) -> dict[str, Any]:
    """``data`` with a string "pad" that makes its JSON text exactly LIMIT + extra bytes."""
    out = {**data, "pad": ""}
    out["pad"] = "x" * (LIMIT + extra - _size(out))
    assert _size(out) == LIMIT + extra
    return out


SCALAR = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
          | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6))
PAYLOAD = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=5)
                       | st.dictionaries(st.text("abc", max_size=3), inner, max_size=3),
                       max_leaves=40)


@settings(max_examples=40, deadline=None)
@given(items=st.lists(PAYLOAD, max_size=60))
def test_data_of_exactly_the_limit_is_kept_and_one_byte_more_refused(items: list[Any]) -> None:
    """docs/events.md: ``data`` is at most 64 KiB *as written*. Refusing early on huge data
    (the walk's budget) must never refuse data within the limit: a list of 10,000 small ints
    (20 KB) was refused as 'larger than 65536 bytes' (each int counted as 20 bytes)."""
    at_limit = _padded({"v": items}, 0)
    kept = pe.clean_data("p", "n", at_limit)
    assert kept == json.loads(json.dumps(at_limit)) and _size(kept) == LIMIT
    with pytest.raises(pe.PluginEventError, match="x/p/n: data"):
        pe.clean_data("p", "n", _padded({"v": items}, 1))


@pytest.mark.parametrize("item", [0, 7, -1, 1.5, 0.0, None, True, False, "", "ab", [], [0],
                                  {}, {"k": 0}, [[[]]]])
def test_a_long_list_is_kept_up_to_the_limit(item: Any) -> None:
    n = (LIMIT - 7) // (len(json.dumps(item, separators=(",", ":"))) + 1)  # {"v":[…]}
    assert _size({"v": [item] * n}) <= LIMIT < _size({"v": [item] * (n + 1)})
    assert len(pe.clean_data("p", "n", {"v": [item] * n})["v"]) == n
    with pytest.raises(pe.PluginEventError, match="x/p/n: data"):
        pe.clean_data("p", "n", {"v": [item] * (n + 1)})


@pytest.mark.parametrize("item", [0, 123, 0.5, -1e300, None, True, "", "abc"])
def test_huge_data_is_refused_at_the_element_where_it_passes_the_limit(item: Any) -> None:
    """A million elements are not all walked: the error names the one at which the JSON text
    passes 64 KiB (give or take the closing brackets), so the user sees where."""
    items = [item] * 1_000_000
    lo, hi = 0, LIMIT  # the first k with items[:k + 1] over the limit (binary search)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _size({"v": items[:mid + 1]}) > LIMIT else (mid + 1, hi)
    first_over = lo
    with pytest.raises(pe.PluginEventError) as err:
        pe.clean_data("p", "n", {"v": items})
    message = str(err.value)
    assert message.startswith("plugin event x/p/n: data['v'][")
    assert message.endswith(f"] makes the event larger than {LIMIT} bytes")
    named = int(message.split("][")[1].split("]")[0])
    assert first_over <= named <= first_over + 2


class _NanFloat(float):
    def __float__(self) -> float:
        return math.nan

    def __repr__(self) -> str:
        return "NaN"


class _HugeInt(int):
    def __int__(self) -> int:
        return 2**80

    def __index__(self) -> int:
        return 2**80

    def __str__(self) -> str:
        return "9" * 40

    __repr__ = __str__


def test_number_subclasses_are_recorded_as_the_number_they_hold() -> None:
    """Python object-protocol tricks (docs/security.md): a float subclass whose __float__ says
    nan was recorded as NaN (not JSON: every reader of the line fails), an int subclass whose
    __int__ says 2**80 passed the 64-bit check and was recorded as that."""
    ledger = Ledger("s-num")
    event = pe.record(ledger, "p", "n", {"f": _NanFloat(1.5), "i": _HugeInt(3),
                                         "l": [_HugeInt(-4), _NanFloat(0.25)]})
    assert event.data == {"f": 1.5, "i": 3, "l": [-4, 0.25]}
    assert [type(v) for v in (event.data["f"], event.data["i"], *event.data["l"])] \
        == [float, int, int, float]
    # and what the ledger holds reads back as exactly that
    again = pe.from_raw(json.loads(json.dumps({"type": "x/p/n", "data": thaw(event.data)})))
    assert again.data == event.data


# ------------------------------------------------------- found by the mutation run at 9bb1385


def test_record_event_in_a_session_run_checks_the_plugin_against_the_app(tmp_path: Path) -> None:
    """Inside a Session's run, record_event goes through the Session: the plugin must be one
    of the app's (a run context made by hand has no app to check against)."""
    from dsh.config.loader import config_from_dict
    from dsh.run.app import App

    app = App(config_from_dict({"autoload": False, "sessions_dir": str(tmp_path / "s"),
                                "model": "echo"}))
    with app.session() as s:
        ctx = RunContext(run_id="r", agent="default", ledger=s.ledger, session=s)
        with activate(ctx):
            with pytest.raises(pe.PluginEventError,
                               match="no plugin 'nosuch' is registered in this app"):
                pe.record_event("nosuch", "n", {"x": 1})
            assert s.ledger.projection.seq == -1  # nothing written
            e = pe.record_event("app", "n", {"x": 1})
            assert (e.plugin, e.data, e.version) == ("app", {"x": 1}, 1)
            assert pe.plugin_events("app") == [e]


def test_record_event_without_a_session_keeps_data_and_the_default_version() -> None:
    ledger = Ledger("s-nosession")
    with activate(RunContext(run_id="r", agent="a", ledger=ledger)):
        e = pe.record_event("anyname", "n", {"x": [1, "two"]})
    assert e.data == {"x": [1, "two"]} and e.version == 1
    assert pe.read(ledger, "anyname", "n")[0].data == {"x": [1, "two"]}


def test_outside_a_run_the_error_says_what_to_use_instead() -> None:
    for call in (lambda: pe.record_event("app", "n"), lambda: pe.plugin_events("app")):
        with pytest.raises(pe.OutsideRun) as err:
            call()
        assert str(err.value) == (
            "dsh.ledger.plugin_events: record_event/plugin_events act on the current run's "
            "session and were called outside a run; from library code use "
            "Session.record_event / Session.plugin_events")


def test_read_names_which_name_is_invalid() -> None:
    ledger = Ledger("s-read")
    with pytest.raises(pe.PluginEventError,
                       match=r"^invalid plugin event plugin name 'a/b': use 1-64 letters"):
        pe.read(ledger, "a/b")
    with pytest.raises(pe.PluginEventError, match=r"^invalid plugin event name 'x y': use 1-64"):
        pe.read(ledger, "p", "x y")


def test_distribution_names_compare_as_pypi_does() -> None:
    assert owners._normal("Dsh_Hooks") == "dsh-hooks"
    assert owners._normal("a.-_b__c") == "a-b-c" and owners._normal("plain") == "plain"


def test_from_raw_depth_limit_counts_objects_as_lists() -> None:
    def nested(n: int) -> Any:
        value: Any = 0
        for _ in range(n):
            value = {"k": value}
        return value

    # MAX_READ_DEPTH objects, data itself the outermost, are read; one more is refused
    deepest = pe.from_raw({**BASE, "data": nested(pe.MAX_READ_DEPTH)}).data
    for _ in range(pe.MAX_READ_DEPTH - 1):
        deepest = deepest["k"]
    assert deepest == {"k": 0}
    with pytest.raises(InvalidLine, match="nests more than"):
        pe.from_raw({**BASE, "data": nested(pe.MAX_READ_DEPTH + 1)})


def test_an_index_out_of_range_says_so() -> None:
    with pytest.raises(IndexError, match="^plugin event index out of range$"):
        pe.read(Ledger("s-idx"), "p")[0]
