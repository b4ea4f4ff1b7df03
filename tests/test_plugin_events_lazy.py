"""Plugin events of a loaded ledger are checked at load and built at their first read (issue 25:
resume of 100k events with 10k recorded-state updates within 10% of without).

What must not change: every event read is the one the eager reader (``from_raw``, used by
``sessions show``) builds from the same line; a bad line still fails the load, naming the file
and line; both index lists of an event give the same object; and every way of reading an
index list — indexing, slicing, iterating, reversing, searching, comparing, copying, ``repr``
— gives what a plain list of the built events gives.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.core.errors import LedgerError
from dsh.core.messages import FrozenDict
from dsh.ledger.events import PluginEvent
from dsh.ledger.history import EventList
from dsh.ledger.plugin_events import from_raw
from dsh.ledger.state import StateKey
from dsh.ledger.store import JsonlStore

HEAD = {"v": 1, "ts": "2026-12-01T00:00:00.000Z", "session": "s1"}


def _write(tmp: Path, payloads: list[tuple[str, str, dict[str, Any]]],
           extra: dict[str, Any] | None = None) -> tuple[JsonlStore, list[dict[str, Any]]]:
    """A ledger file of one turn start and the given plugin events; returns the store and
    the lines (as written)."""
    lines: list[dict[str, Any]] = [{**HEAD, "seq": 0, "type": "turn/start", "turn": 1,
                                    "agent": "default"}]
    for plugin, name, data in payloads:
        lines.append({**HEAD, "seq": len(lines), "type": f"x/{plugin}/{name}",
                      "plugin": plugin, "name": name, "data": data, **(extra or {})})
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "s1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return JsonlStore(tmp, fsync="never"), lines


def _unbuilt(events: list[Any]) -> int:
    """How many entries of an index list are not built yet (read past EventList's methods)."""
    items = [list.__getitem__(events, i) for i in range(len(events))]
    return sum(type(x) is not PluginEvent and getattr(x, "event", None) is None for x in items)


def test_loading_builds_nothing_and_a_read_builds_what_it_reads(tmp_path: Path) -> None:
    store, lines = _write(tmp_path, [("p", "n", {"i": i, "l": [{"k": i}]}) for i in range(20)])
    with store.open("s1") as ledger:
        index = ledger.projection.plugin_index
        assert index is not None
        by_name, by_plugin = index[("p", "n")], index["p"]
        assert type(by_name) is EventList and type(by_plugin) is EventList
        assert _unbuilt(by_name) == 20 and _unbuilt(by_plugin) == 20
        last = by_name[-1]
        assert type(last) is PluginEvent
        assert _unbuilt(by_name) == 19
        # the other list holds the same line: it gives the very same object, built once,
        # and the decoded line is not kept once it is built
        holder = list.__getitem__(by_plugin, 19)
        assert holder.event is last and holder.line is None
        assert by_plugin[-1] is last
        assert last == from_raw(json.loads(json.dumps(lines[-1])))
        assert type(last.data) is FrozenDict and last.data["l"][0] == {"k": 19}
        with pytest.raises(TypeError):
            last.data["l"].append(1)  # type: ignore[attr-defined]
        assert list(by_name) == [from_raw(json.loads(json.dumps(x))) for x in lines[1:]]
        assert _unbuilt(by_name) == 0


def test_a_state_key_that_replaces_builds_only_the_newest_update(tmp_path: Path) -> None:
    key: StateKey[Any] = StateKey("app", "lazy-newest", 0, lambda s, d: d["v"], replaces=True)
    store, _ = _write(tmp_path, [("app", "lazy-newest", {"v": i}) for i in range(100)])
    with store.open("s1") as ledger:
        assert key.read(ledger.projection) == 99
        assert _unbuilt(ledger.projection.plugin_index[("app", "lazy-newest")]) == 99
        assert key.read(ledger.projection, at=50) == 49  # seq 50 is the 50th update
        assert _unbuilt(ledger.projection.plugin_index["app"]) == 0  # at= reads them all


@pytest.mark.parametrize(("data", "message"), [
    ({"d": json.loads("[" * 200 + "]" * 200)}, "nests more than 128 levels deep"),
    ([1, 2], "is a list, not an object"),
])
def test_a_bad_plugin_event_line_still_fails_the_load(tmp_path: Path, data: Any,
                                                      message: str) -> None:
    store, _ = _write(tmp_path, [("p", "ok", {}), ("p", "bad", data), ("p", "ok", {})])
    with pytest.raises(LedgerError) as err:
        store.open("s1")
    assert str(err.value).startswith(f"{tmp_path / 's1.jsonl'}:3: invalid plugin event:")
    assert message in str(err.value)


def test_a_line_with_other_keys_and_version_is_built_as_the_eager_reader_builds_it(
        tmp_path: Path) -> None:
    store, lines = _write(tmp_path, [("p", "n", {"a": [1, {"b": None}]})],
                          extra={"version": 3, "note": {"kept": True}})
    with store.open("s1") as ledger:
        event = ledger.projection.plugin_index["p"][0]
    assert event == from_raw(json.loads(json.dumps(lines[1])))
    assert event.version == 3 and event.extra == {"note": {"kept": True}}


# -- every way of reading an index list, against a plain list of the eager reader's events --

_json = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                     max_leaves=8)
_payloads = st.lists(st.tuples(st.sampled_from(["p", "q"]), st.sampled_from(["a", "b"]),
                               st.dictionaries(st.text(max_size=3), _json, max_size=3)),
                     min_size=1, max_size=8)


READS: list[Any] = [
    lambda e, p: len(e), lambda e, p: e[0], lambda e, p: e[-1], lambda e, p: e[1:],
    lambda e, p: e[::-1], lambda e, p: e[-len(e)], lambda e, p: e[len(e) - 1],
    lambda e, p: list(e), lambda e, p: list(reversed(e)), lambda e, p: p in e,
    lambda e, p: e.count(p), lambda e, p: e.index(p) if p in e else None,
    lambda e, p: repr(e), lambda e, p: e == [*e], lambda e, p: e != [*e],
    lambda e, p: e == list(e)[::-1], lambda e, p: e != list(e)[::-1], lambda e, p: e.copy(),
    lambda e, p: e + [p], lambda e, p: [p] + e, lambda e, p: 2 * e, lambda e, p: e * 2,
    lambda e, p: bool(e), lambda e, p: pickle.loads(pickle.dumps(e)),
    lambda e, p: type(pickle.loads(pickle.dumps(e))).__name__ == type(e).__name__,
    lambda e, p: (e.pop(), list(e)), lambda e, p: (e.pop(0), list(e)),
    lambda e, p: _raised(lambda: e.index(p, len(e))),
    lambda e, p: _raised(lambda: e.index(p, 0, 0)),
]


def _raised(call: Any) -> Any:
    try:
        return call()
    except ValueError as exc:
        return ("ValueError", str(exc))


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads=_payloads)
def test_every_read_of_an_index_list_is_a_plain_lists(tmp_path: Path, payloads: Any) -> None:
    store, lines = _write(tmp_path, payloads)
    eager = [from_raw(json.loads(json.dumps(x))) for x in lines[1:]]
    probe = eager[len(eager) // 2]
    keys = {p for p, _, _ in payloads} | {(p, n) for p, n, _ in payloads}
    for which, read in enumerate(READS):
        with store.open("s1") as ledger:  # each read on a freshly loaded ledger
            index = ledger.projection.plugin_index
            assert index is not None
            for key in sorted(keys, key=str):
                expected = [e for e in eager if (e.plugin if isinstance(key, str)
                                                else (e.plugin, e.name)) == key]
                # one read per list, on lines not built yet (but those another list read)
                assert read(index[key], probe) == read(expected, probe), which
    with store.open("s1") as ledger:
        index = ledger.projection.plugin_index
        assert index is not None
        some = sorted(keys, key=str)[0]
        # comparing two index lists (neither built yet) compares their built events
        assert index[some] == index[some] and not index[some] != index[some]
        other = [k for k in keys if k != some and isinstance(k, type(some))]
        if other:
            assert (index[some] == index[other[0]]) == (list(index[some]) == list(index[other[0]]))


def test_an_event_appended_while_another_is_built_is_kept(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading ``[-1]`` builds that line; if the projection appends meanwhile (a tool call
    recording an event in another thread), the new event must stay where it was appended."""
    import dsh.ledger.history as history

    store, _ = _write(tmp_path, [("p", "n", {"i": i}) for i in range(3)])
    with store.open("s1") as ledger:
        projection = ledger.projection
        events = projection.plugin_index[("p", "n")]
        newcomer = PluginEvent(seq=99, ts="t", session="s1", plugin="p", name="n", data={})
        build = history.from_checked

        def racing(line: dict[str, Any]) -> PluginEvent:
            if newcomer not in list.__iter__(events):  # once: what a concurrent append does
                projection._index("p", "n", newcomer)
            return build(line)

        monkeypatch.setattr(history, "from_checked", racing)
        assert events[-1].data == {"i": 2}
        assert events[-1] is newcomer and len(events) == 4
        assert [e.data for e in events] == [{"i": 0}, {"i": 1}, {"i": 2}, {}]


def test_threads_reading_one_line_at_once_get_one_event(tmp_path: Path) -> None:
    import threading

    store, _ = _write(tmp_path, [("p", "n", {"big": list(range(2000))}) for _ in range(30)])
    with store.open("s1") as ledger:
        index = ledger.projection.plugin_index
        got: list[list[PluginEvent]] = []
        start = threading.Barrier(4)

        def read(key: Any) -> None:
            start.wait()
            got.append(list(index[key]))

        threads = [threading.Thread(target=read, args=(k,)) for k in ("p", ("p", "n")) * 2]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(got) == 4
    for i in range(30):
        assert all(g[i] is got[0][i] for g in got)
    with pytest.raises(IndexError, match="^list index out of range$"):
        index["p"][-31]
    with pytest.raises(IndexError, match="^list index out of range$"):
        index["p"][30]


# -- checked_raw + from_checked (the load's two halves) against from_raw (the eager reader) --

from dsh.ledger import plugin_events as pe  # noqa: E402
from dsh.ledger.serialize import InvalidLine  # noqa: E402

_values = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=4),
                    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2),
                                                                         st.integers(),
                                                                         max_size=2))
_lines = st.fixed_dictionaries(
    {"type": st.sampled_from(["x/p/n", "x/q/n", "x/p", "x//n", "x/p/", "x/p/n/m", "x/a.b/c-d"])},
    optional={"v": st.sampled_from([1, 2, "1"]), "seq": st.one_of(st.integers(0, 9), _values),
              "ts": st.one_of(st.just("t"), _values), "session": st.one_of(st.just("s"), _values),
              "plugin": st.one_of(st.sampled_from(["p", "q", "a.b"]), _values),
              "name": st.one_of(st.sampled_from(["n", "c-d"]), _values),
              "data": st.one_of(_json.filter(lambda x: isinstance(x, dict)), _values),
              "version": st.one_of(st.integers(1, 5), _values), "other": _values})


def _outcome(read: Any, line: dict[str, Any]) -> Any:
    try:
        got = read(json.loads(json.dumps(line)))
        # (events compare without ``extra``: compare it too)
        return (got, got.extra, repr(got)) if isinstance(got, PluginEvent) else got
    except InvalidLine as exc:
        return ("refused", str(exc))


@settings(max_examples=300, deadline=None)
@given(line=_lines)
def test_checking_then_building_is_reading_eagerly(line: dict[str, Any]) -> None:
    def lazily(d: dict[str, Any]) -> Any:
        plugin, name = pe.checked_raw(d)
        event = pe.from_checked(d)
        assert (event.plugin, event.name) == (plugin, name)
        return event

    assert _outcome(lazily, line) == _outcome(pe.from_raw, line)


def _nested(n: int, box: Any) -> Any:
    value: Any = 0
    for _ in range(n):
        value = box(value)
    return value


@pytest.mark.parametrize("box", [lambda v: [v], lambda v: {"k": v}])
def test_the_depth_checked_at_load_is_the_eager_readers(box: Any) -> None:
    base = {"v": 1, "type": "x/p/n", "seq": 3, "ts": "t", "session": "s"}
    # data itself is the outermost level: MAX_READ_DEPTH levels in all are read, one more not
    assert pe.checked_raw({**base, "data": {"k": _nested(pe.MAX_READ_DEPTH - 1, box)}}) \
        == ("p", "n")
    with pytest.raises(InvalidLine) as err:
        pe.checked_raw({**base, "data": {"k": _nested(pe.MAX_READ_DEPTH, box)}})
    assert str(err.value) == f"'data' of 'x/p/n' nests more than {pe.MAX_READ_DEPTH} levels deep"
    for depth in (pe.MAX_READ_DEPTH - 1, pe.MAX_READ_DEPTH):
        line = {**base, "data": {"k": _nested(depth, box)}}
        assert _outcome(pe.checked_raw, line) == _outcome(
            lambda d: (pe.from_raw(d).plugin, "n"), line)


def test_the_cache_of_well_formed_tags_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pe, "_TAGS", {})
    for i in range(1100):
        pe.checked_raw({"type": f"x/p{i}/n{i}"})
    assert len(pe._TAGS) == 1024 and pe._TAGS["x/p1023/n1023"] == ("p1023", "n1023")
    # a tag past the bound is read all the same, each time
    for _ in range(2):
        event = pe.from_checked({"type": "x/p1099/n1099", "data": {"a": 1}})
        assert (event.plugin, event.name, event.data) == ("p1099", "n1099", {"a": 1})
    assert "x/p1099/n1099" not in pe._TAGS


def test_a_tag_read_again_is_taken_from_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pe, "_TAGS", {})
    assert pe.checked_raw({"type": "x/p/n"}) == ("p", "n")
    cached = pe._TAGS["x/p/n"]
    assert pe.checked_raw({"type": "x/p/n", "plugin": "p"}) == ("p", "n")
    assert pe._TAGS["x/p/n"] is cached  # not split and stored anew
    with pytest.raises(InvalidLine, match="disagree with the tag"):
        pe.checked_raw({"type": "x/p/n", "plugin": "q"})  # a cached tag is still compared


def test_two_index_lists_of_the_same_events_are_equal(tmp_path: Path) -> None:
    store, _ = _write(tmp_path, [("p", "n", {"i": i}) for i in range(3)])
    with store.open("s1") as ledger:
        index = ledger.projection.plugin_index
        assert index is not None
        by_plugin, by_name = index["p"], index[("p", "n")]
        assert by_plugin is not by_name
        assert by_plugin == by_name and not by_plugin != by_name  # neither built before
        assert by_name == by_plugin
        assert by_plugin != by_name[:2] and by_plugin != ()
    with store.open("s1") as ledger:
        index = ledger.projection.plugin_index
        assert index is not None
        assert index[("p", "n")] == index["p"]  # the other list unbuilt when compared
        assert type(list.__getitem__(index["p"], 0)) is PluginEvent  # and built by it


def test_a_long_tag_is_read_but_not_kept_in_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hand-made ledger's tags are kept for the life of the process only as long as dsh
    writes them (two names of at most MAX_NAME): a megabyte tag is read, not pinned."""
    monkeypatch.setattr(pe, "_TAGS", {})
    longest = "x/" + "p" * pe.MAX_NAME + "/" + "n" * pe.MAX_NAME
    assert pe.checked_raw({"type": longest}) == ("p" * pe.MAX_NAME, "n" * pe.MAX_NAME)
    assert longest in pe._TAGS
    longer = "x/" + "p" * (pe.MAX_NAME + 1) + "/" + "n" * pe.MAX_NAME
    huge = "x/" + "p" * 1_000_000 + "/n"
    for tag in (longer, huge):
        assert pe.checked_raw({"type": tag})[1].startswith("n")
        assert tag not in pe._TAGS
    assert len(pe._TAGS) == 1


# -- the depth bound read from the line's brackets (no walk of a line with few of them) -----

_boxes = st.lists(st.sampled_from(["list", "dict"]), min_size=pe.MAX_READ_DEPTH - 4,
                  max_size=pe.MAX_READ_DEPTH + 2)


@settings(max_examples=200, deadline=None)
@given(boxes=_boxes, noise=st.text(alphabet="{[]} a", max_size=12))
def test_the_bracket_bound_gives_the_walks_answer(boxes: list[str], noise: str) -> None:
    """Whatever the nesting near the limit, and brackets in strings (which only count more),
    the load's answer given the line's text is the answer of the full walk without it."""
    value: Any = noise
    for box in boxes:
        value = [value] if box == "list" else {"k": value}
    d = {"v": 1, "type": "x/p/n", "seq": 1, "ts": "t", "session": "s", "data": {"d": value}}
    line = json.dumps(d)
    assert _outcome(lambda x: pe.checked_raw(x, line), d) == _outcome(pe.checked_raw, d)


def test_a_line_with_few_brackets_is_not_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    walked: list[int] = []
    walk = pe._shallow
    monkeypatch.setattr(pe, "_shallow", lambda v, depth: walked.append(depth) or walk(v, depth))
    d = {"type": "x/dsh.tasks/tasks", "data": {"tasks": [{"content": "a", "status": "done"}] * 5}}
    line = json.dumps(d)
    assert line.count("{") + line.count("[") == 8
    assert pe.checked_raw(d, line) == ("dsh.tasks", "tasks") and walked == []
    assert pe.checked_raw(d) == ("dsh.tasks", "tasks") and walked[0] == 0  # no text: walked
    # one bracket over the bound (here in a string): walked, and read all the same
    d["data"]["note"] = "[" * (pe.MAX_READ_DEPTH + 2 - 8)
    line = json.dumps(d)
    assert line.count("{") + line.count("[") == pe.MAX_READ_DEPTH + 2
    walked.clear()
    assert pe.checked_raw(d, line) == ("dsh.tasks", "tasks") and walked[0] == 0
    d["data"]["note"] = "[" * (pe.MAX_READ_DEPTH + 1 - 8)  # at the bound: not walked
    walked.clear()
    assert pe.checked_raw(d, json.dumps(d)) == ("dsh.tasks", "tasks") and walked == []


def test_a_resumed_plugin_event_keeps_its_line_not_the_decoded_object(tmp_path: Path) -> None:
    """What the load keeps of an unread plugin event is its text (a str the cyclic collector
    never walks), decoded again when read: the same event as the eager reader's."""
    store, lines = _write(tmp_path, [("p", "n", {"tasks": [{"i": i} for i in range(3)]})])
    with store.open("s1") as ledger:
        index = ledger.projection.plugin_index
        assert index is not None
        held = list.__getitem__(index[("p", "n")], 0)
        assert type(held.line) is str and json.loads(held.line) == lines[1]
        event = index[("p", "n")][0]
        assert event == from_raw(lines[1]) and held.line is None and held.event is event
        assert index["p"][0] is event


def test_resuming_walks_no_line_with_few_brackets(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The load hands each line's text to the check: a task list's line is not walked for its
    depth (the walk was most of the check's cost), a deep one still is, and refused."""
    walked: list[int] = []
    walk = pe._shallow
    monkeypatch.setattr(pe, "_shallow", lambda v, depth: walked.append(depth) or walk(v, depth))
    store, _ = _write(tmp_path, [("dsh.tasks", "tasks", {"tasks": [{"content": "a"}] * 5})])
    with store.open("s1") as ledger:
        assert len(ledger.projection.plugin_index[("dsh.tasks", "tasks")]) == 1  # type: ignore[index]
    assert walked == []
    deep = _nested(pe.MAX_READ_DEPTH, lambda v: [v])
    store, _ = _write(tmp_path / "deep", [("p", "n", {"k": deep}), ("p", "n", {})])
    with pytest.raises(LedgerError, match=r":2: invalid plugin event: .* nests more than"):
        store.open("s1")
    assert walked and walked[0] == 0
