"""StateKey(replaces=True) (issue 25: resume of 10k task-list updates): a read folds only the
newest update it has not folded, with the value the full fold gives; and frozen_json's fast
return for values that are already frozen or atomic."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from dsh.core.messages import FrozenDict
from dsh.core.messages import FrozenList
from dsh.ledger.events import PluginEvent
from dsh.ledger.reader import open_session
from dsh.ledger.state import StateError
from dsh.ledger.state import StateKey
from dsh.ledger.state import frozen_json
from dsh.run.app import App
from dsh.run.tasks import TASKS

CALLS: list[Any] = []


def whole(state: Any, data: Mapping[str, Any]) -> Any:
    """A reducer whose value is the update's: it ignores ``state``."""
    CALLS.append(data)
    if data.get("bad"):
        raise ValueError("refused")
    return data["value"]


REPLACING: StateKey[Any] = StateKey("app", "replacing", "start", whole, replaces=True)
FOLDING: StateKey[Any] = StateKey("app", "folding", "start", whole)


def app_for(tmp: Path) -> App:
    return App.from_config({"autoload": False, "model": "echo",
                            "sessions_dir": str(tmp / "sessions")})


def _record(tmp: Path, key: StateKey[Any], updates: list[dict[str, Any]]) -> str:
    with app_for(tmp).session() as s:
        for data in updates:  # written as lines, as a hand-edited ledger could hold them
            s.ledger.append(PluginEvent, plugin=key.plugin, name=key.name, data=data,
                            version=1)
        return str(s.id)


def test_a_replacing_key_folds_only_the_newest_update_on_resume(tmp_path: Path) -> None:
    sid = _record(tmp_path, REPLACING, [{"value": i} for i in range(50)])
    CALLS.clear()
    with app_for(tmp_path).session(None, sid) as s:
        assert s.state(REPLACING) == 49
        assert len(CALLS) == 1  # not 50
        assert s.state(REPLACING) == 49 and len(CALLS) == 1  # cached
        assert s.update_state(REPLACING, {"value": "next"}) == "next"
        assert s.state(REPLACING) == "next" and len(CALLS) == 2


def test_a_key_that_does_not_replace_still_folds_every_update(tmp_path: Path) -> None:
    sid = _record(tmp_path, FOLDING, [{"value": i} for i in range(50)])
    CALLS.clear()
    with app_for(tmp_path).session(None, sid) as s:
        assert s.state(FOLDING) == 49
        assert len(CALLS) == 50


def test_replacing_gives_the_full_folds_value_at_every_point(tmp_path: Path) -> None:
    updates = [{"value": [i, {"k": str(i)}]} for i in range(7)]
    sid = _record(tmp_path, REPLACING, updates)
    reader = open_session(tmp_path / "sessions", sid)
    seqs = [e.seq for e in reader.plugin_events("app", "replacing")]
    assert reader.state(REPLACING) == [6, {"k": "6"}]
    assert [reader.state(REPLACING, at=q) for q in seqs] == [u["value"] for u in updates]
    assert reader.state(REPLACING, at=seqs[0] - 1) == "start"
    CALLS.clear()
    assert reader.state(REPLACING, at=seqs[3]) == [3, {"k": "3"}]
    assert len(CALLS) == 1  # only the newest update at or before seq


def test_an_earlier_refused_update_no_longer_matters_but_the_newest_is_checked(
        tmp_path: Path) -> None:
    sid = _record(tmp_path, REPLACING, [{"value": 1, "bad": True}, {"value": 2}])
    with app_for(tmp_path).session(None, sid) as s:
        assert s.state(REPLACING) == 2
    sid = _record(tmp_path, REPLACING, [{"value": 1}, {"value": 2, "bad": True}])
    with app_for(tmp_path).session(None, sid) as s, pytest.raises(StateError, match="refused"):
        s.state(REPLACING)
    # the same lines under a key that folds everything: the early refusal is reported
    sid = _record(tmp_path, FOLDING, [{"value": 1, "bad": True}, {"value": 2}])
    with app_for(tmp_path).session(None, sid) as s, pytest.raises(StateError, match="refused"):
        s.state(FOLDING)


def test_the_task_list_replaces() -> None:
    assert TASKS.replaces is True


def test_frozen_json_returns_frozen_and_atomic_values_as_they_are() -> None:
    fd, fl = FrozenDict(a=1), FrozenList([1])
    for value in (fd, fl, "text", 3, True, None):
        assert frozen_json(value, "here") is value
    built = frozen_json({"a": [1, {"b": 2.5}]}, "here")
    assert type(built) is FrozenDict and type(built["a"]) is FrozenList
    for bad in (math.nan, math.inf, -math.inf):  # floats are still checked
        with pytest.raises(StateError, match="JSON cannot represent"):
            frozen_json(bad, "here")
    with pytest.raises(StateError, match="not JSON"):
        frozen_json({1, 2}, "here")


def test_replaces_is_kept_as_a_bool_when_the_key_is_made() -> None:
    # made here, not at import: what the constructor stores is what a read then goes by
    made = StateKey("app", "madehere", "start", whole, replaces=True)
    assert made.replaces is True
    assert StateKey("app", "madehere2", 0, whole, replaces=1).replaces is True
    assert StateKey("app", "madehere3", 0, whole).replaces is False
