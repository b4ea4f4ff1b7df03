"""dsh.tasks' reducer when folding a resumed session (issue 25, benchmarks/resume.py): a
recorded list read back from the ledger is kept as it is after one loop of exact type checks
(the fast path), and that path decides exactly as the general one does, for any input."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.core.messages import FrozenDict
from dsh.core.messages import FrozenList
from dsh.core.messages import freeze
from dsh.ledger.events import PluginEvent
from dsh.ledger.store import JsonlStore
from dsh.run import tasks as T


def general(data: Mapping[str, Any]) -> Any:
    """The reducer without its fast path: what it decided before the fast path existed."""
    tasks = data.get("tasks", [])
    problem = T.problems(tasks)
    if problem:
        raise ValueError(problem)
    if all(t.keys() == T._KEYS for t in tasks):
        return tasks
    return [{"content": t["content"], "status": t["status"]} for t in tasks]


def outcome(data: Mapping[str, Any]) -> tuple[str, Any]:
    try:
        return "kept", T.reduce([], data)
    except ValueError as exc:
        return "refused", str(exc)


def expected(data: Mapping[str, Any]) -> tuple[str, Any]:
    try:
        return "kept", general(data)
    except ValueError as exc:
        return "refused", str(exc)


_scalar = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) \
    | st.text(max_size=6)
_odd = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
_content = st.one_of(st.sampled_from(["", " ", "\t\n", "x" * 500, "x" * 501, " a "]),
                     st.text(max_size=12), _odd)
_status = st.one_of(st.sampled_from([*T.STATUSES, "done", "", "PENDING"]), _odd)
_item = st.one_of(
    st.fixed_dictionaries({"content": _content, "status": _status}),
    st.fixed_dictionaries({"content": _content, "status": _status, "extra": _odd}),
    st.fixed_dictionaries({"content": _content}),
    _odd,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(_item, max_size=6), _odd,
                 st.lists(st.just({"content": "a", "status": "pending"}),
                          min_size=T.MAX_TASKS - 1, max_size=T.MAX_TASKS + 1)))
def test_the_fast_path_decides_as_the_general_path_for_any_recorded_list(tasks: Any) -> None:
    data = freeze({"tasks": tasks})  # what a fold hands the reducer: read back, read-only
    got, want = outcome(data), expected(data)
    assert got == want
    if got[0] == "kept" and all(type(t) is FrozenDict and t.keys() == T._KEYS
                                for t in data["tasks"]):
        assert got[1] is data["tasks"]  # kept as recorded, not copied


def test_the_fast_path_refuses_each_bad_item_with_the_general_reason() -> None:
    good = {"content": "write it", "status": "pending"}
    for bad, reason in [
        ({"content": "  ", "status": "pending"}, "tasks[1].content must be non-empty text"),
        ({"content": "x" * (T.MAX_CONTENT + 1), "status": "pending"},
         f"tasks[1].content is {T.MAX_CONTENT + 1} characters"),
        ({"content": 3, "status": "pending"}, "tasks[1].content must be non-empty text"),
        ({"content": "a", "status": "done"}, "tasks[1].status must be one of"),
        ({"content": "a", "status": {"not": "hashable"}}, "tasks[1].status must be one of"),
        ([1], "tasks[1] must be an object"),
    ]:
        with pytest.raises(ValueError, match=re.escape(reason)):
            T.reduce([], freeze({"tasks": [good, bad]}))
    too_many = freeze({"tasks": [good] * (T.MAX_TASKS + 1)})
    with pytest.raises(ValueError, match=f"at most {T.MAX_TASKS} tasks"):
        T.reduce([], too_many)
    exactly = freeze({"tasks": [{"content": "x" * T.MAX_CONTENT, "status": "completed"}]
                      * T.MAX_TASKS})
    assert T.reduce([], exactly) is exactly["tasks"]


def test_a_list_that_is_not_exactly_recorded_items_is_not_kept_as_it_is() -> None:
    extra = freeze({"tasks": [{"content": "a", "status": "pending", "note": "n"}]})
    kept = T.reduce([], extra)
    assert kept == [{"content": "a", "status": "pending"}] and kept is not extra["tasks"]
    # a read-only list of plain dicts (never what a fold hands over: recorded data is frozen
    # all the way down) leaves the fast path and gets the general path's answer
    plain = FrozenList([{"content": "a", "status": "pending"}])
    assert T.reduce([], FrozenDict({"tasks": plain})) == general({"tasks": plain})


def test_a_resumed_task_list_cannot_be_changed_through_what_the_fold_returns(
        tmp_path: Path) -> None:
    store = JsonlStore(tmp_path, fsync="never")
    lists = [[{"content": f"t{i}.{j}", "status": "pending"} for j in range(3)]
             for i in range(4)]
    with store.create() as ledger:
        for tasks in lists:
            ledger.append(PluginEvent, plugin=T.PLUGIN, name="tasks", data={"tasks": tasks})
        sid = ledger.session_id
    with store.open(sid) as ledger:
        value = T.TASKS.read(ledger.projection)
        assert value == lists[-1]
        index = ledger.projection.plugin_index
        assert index is not None
        recorded = index[(T.PLUGIN, "tasks")][-1].data["tasks"]
        assert value is recorded  # the fast path kept the recorded (read-only) list
        attempts = [
            lambda: value.append({"content": "x", "status": "pending"}),
            lambda: value.__setitem__(0, {}),
            lambda: value[0].__setitem__("status", "completed"),
            lambda: value[0].update(status="completed"),
            lambda: value.sort(key=str),
            lambda: value[1].pop("content"),
        ]
        for attempt in attempts:
            with pytest.raises(TypeError, match="read-only"):
                attempt()
        # a copy made from it is the caller's own; the recorded value is unchanged
        mine = [dict(t) for t in value]
        mine[0]["status"] = "completed"
        assert T.TASKS.read(ledger.projection) == lists[-1]
        assert T.TASKS.read(ledger.projection, at=ledger.projection.seq - 1) == lists[-2]
