"""Pins for dsh/ledger/state.py that mutation testing found loose (issue 25): what a plugin
author relies on from ``StateKey`` — the documented defaults, the exact refusals (which plugin,
which key, which event, where in the value), the size cap at its boundary, the depth limit,
``{"$state": …}``, the cache staying right when events arrive by another route, ``at=``, and
``get``/``update`` inside a run with and without a Session.

Most tests use an in-memory :class:`~dsh.ledger.writer.Ledger` (no files): they run in
milliseconds, so the mutation driver can run them for each of the module's mutants."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pluggy
import pytest

from dsh.core.messages import FrozenDict
from dsh.core.messages import FrozenList
from dsh.core.messages import freeze
from dsh.host.runcontext import RunContext
from dsh.host.runcontext import activate
from dsh.ledger import state as st
from dsh.ledger.events import PluginEvent
from dsh.ledger.history import Projection
from dsh.ledger.plugin_events import MAX_DEPTH
from dsh.ledger.plugin_events import PluginEventError
from dsh.ledger.state import StateError
from dsh.ledger.state import StateKey
from dsh.ledger.state import frozen_json
from dsh.ledger.writer import Ledger


def add(state: int, data: Mapping[str, Any]) -> int:
    return state + int(data.get("by", 1))


def append(state: Any, data: Mapping[str, Any]) -> list[Any]:
    return [*state, data["n"]]


def _json_size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


#: A value that is not JSON, typed so that it can be passed where JSON is expected.
NOT_JSON: Any = {1}


def nested(levels: int, leaf: Any = 0, *, as_dict: bool = False) -> Any:
    """``levels`` containers, one inside the other, around ``leaf``."""
    value = leaf
    for _ in range(levels):
        value = {"k": value} if as_dict else [value]
    return value


# ------------------------------------------------------------------ defaults and identity


def test_the_documented_defaults_and_the_registry() -> None:
    assert st.MAX_STATE_BYTES == 262144  # docs/plugins.md: max_bytes=262144
    assert st.SET == "$state"
    show = str
    key: StateKey[Any] = StateKey("app", "pins-defaults", {"a": [1]}, add, show=show)
    assert (key.plugin, key.name, key.version, key.max_bytes) == ("app", "pins-defaults", 1,
                                                                  262144)
    assert key.reduce is add and key.show is show
    assert StateKey("app", "pins-noshow", 0, add).show is None
    assert key.initial == {"a": [1]}
    assert type(key.initial) is FrozenDict and type(key.initial["a"]) is FrozenList
    assert st.KEYS[("app", "pins-defaults")] is key
    assert repr(key) == "StateKey('app', 'pins-defaults')"
    again = StateKey("app", "pins-defaults", 0, add, version=7, max_bytes=10)
    assert st.KEYS[("app", "pins-defaults")] is again  # the newest definition wins
    assert (again.version, again.max_bytes) == (7, 10)


def test_a_bad_definition_names_what_is_wrong() -> None:
    with pytest.raises(PluginEventError,
                       match=r"^invalid plugin event plugin name 'no way': use 1-64 letters"):
        StateKey("no way", "n", 0, add)
    with pytest.raises(PluginEventError, match=r"^invalid plugin event name 'n/m': use"):
        StateKey("app", "n/m", 0, add)
    with pytest.raises(PluginEventError,
                       match=r"^plugin event x/app/vers: version must be an int from 1 to "
                             r"2147483647, not 0$"):
        StateKey("app", "vers", 0, add, version=0)
    with pytest.raises(StateError,
                       match=r"^state app/notfn: reduce must be callable, not int$") as info:
        StateKey("app", "notfn", 0, 3)  # type: ignore[arg-type]
    assert info.value.plugin == "app"
    with pytest.raises(StateError,
                       match=r"^state pins-p/init: the initial value is a set, not JSON "
                             r"\(use None, bool, int, float, str, lists and dicts\)$") as info:
        StateKey("pins-p", "init", NOT_JSON, add)
    assert info.value.plugin == "pins-p"
    assert ("pins-p", "init") not in st.KEYS  # a refused definition is not registered
    bad_size: Any
    for bad_size, shown in ((0, "0"), (-5, "-5"), ("big", "'big'"), (True, "True"),
                            (1.5, "1.5")):
        with pytest.raises(StateError) as info:
            StateKey("pins-p", "size", 0, add, max_bytes=bad_size)
        assert str(info.value) == (f"state pins-p/size: max_bytes must be a positive int, "
                                   f"not {shown}")
        assert info.value.plugin == "pins-p"
    assert StateKey("pins-p", "size", 0, add, max_bytes=1).max_bytes == 1
    with pytest.raises(StateError) as info:
        StateKey("pins-p", "show", 0, add, show="json")  # type: ignore[arg-type]
    assert str(info.value) == "state pins-p/show: show must be callable or None, not str"
    assert info.value.plugin == "pins-p"


# ------------------------------------------------------------------ frozen_json


@pytest.mark.parametrize("value", [None, True, False, 0, -3, 2**70, 1.5, -0.0, "", "é"])
def test_every_json_scalar_is_kept_as_itself(value: Any) -> None:
    out = frozen_json(value, "w")
    assert out == value and type(out) is type(value)


def test_containers_are_frozen_and_frozen_ones_kept_as_they_are() -> None:
    fd, fl = freeze({"a": 1}), freeze([1, 2])
    assert frozen_json(fd, "w") is fd and frozen_json(fl, "w") is fl
    out = frozen_json({"a": [1, (2, {"b": None})], "c": ()}, "w")
    assert out == {"a": [1, [2, {"b": None}]], "c": []}
    assert type(out) is FrozenDict and type(out["a"]) is FrozenList
    assert type(out["a"][1]) is FrozenList and type(out["a"][1][1]) is FrozenDict
    assert type(frozen_json((1, 2), "w")) is FrozenList


def test_frozen_json_names_no_plugin_unless_told() -> None:
    with pytest.raises(StateError, match=r"^W is a set") as info:
        frozen_json(NOT_JSON, "W")
    assert info.value.plugin == ""


@pytest.mark.parametrize(("value", "message"), [
    ({1, 2}, "W is a set, not JSON (use None, bool, int, float, str, lists and dicts)"),
    (float("inf"), "W is inf, which JSON cannot represent"),
    (float("-inf"), "W is -inf, which JSON cannot represent"),
    ({"k": [0, float("nan")]}, "W at ['k'][1] is nan, which JSON cannot represent"),
    ({"k": {2: "x"}}, "W at ['k'][2] has a key of type int"),
    ([b"x"], "W at [0] is a bytes, not JSON (use None, bool, int, float, str, lists and "
             "dicts)"),
    ({"a": {"b": object}}, "W at ['a']['b'] is a type, not JSON (use None, bool, int, float, "
                           "str, lists and dicts)"),
])
def test_what_is_not_json_is_refused_saying_where(value: Any, message: str) -> None:
    with pytest.raises(StateError) as info:
        frozen_json(value, "W", "pins-plug")
    assert str(info.value) == message
    assert info.value.plugin == "pins-plug"


@pytest.mark.parametrize("as_dict", [False, True])
def test_the_depth_limit_is_exact(as_dict: bool) -> None:
    """MAX_DEPTH containers nest; one more is refused, naming where."""
    deepest = nested(MAX_DEPTH, "leaf", as_dict=as_dict)
    assert frozen_json(deepest, "w") == deepest
    with pytest.raises(StateError, match=f"nests deeper than {MAX_DEPTH} levels$") as info:
        frozen_json(nested(MAX_DEPTH + 1, as_dict=as_dict), "W")
    path = ("['k']" if as_dict else "[0]") * MAX_DEPTH
    assert str(info.value) == f"W at {path} nests deeper than {MAX_DEPTH} levels"
    # a scalar is never too deep, however far down it is
    assert frozen_json(nested(MAX_DEPTH, 5, as_dict=as_dict), "w") \
        == nested(MAX_DEPTH, 5, as_dict=as_dict)


def test_depth_counts_lists_and_objects_alike() -> None:
    half = MAX_DEPTH // 2
    mixed = nested(half, nested(MAX_DEPTH - half, as_dict=True))
    assert frozen_json(mixed, "w") == mixed
    with pytest.raises(StateError, match="nests deeper"):
        frozen_json([mixed], "w")
    with pytest.raises(StateError, match="nests deeper"):
        frozen_json({"k": mixed}, "w")


# ------------------------------------------------------------------ reading


def test_reading_a_projection_without_plugin_events_is_the_initial_value() -> None:
    key: StateKey[Any] = StateKey("app", "pins-empty", [1], append)
    p = Projection()
    assert p.plugin_index is None
    assert key.read(p) is key.initial and key.read(p, at=5) is key.initial
    assert p.states is None  # nothing to cache


def test_at_takes_the_events_up_to_and_including_that_seq() -> None:
    key: StateKey[Any] = StateKey("app", "pins-at", [], append)
    ledger = Ledger("s-at")
    ledger.append(PluginEvent, plugin="app", name="other", data={"n": "x"})  # seq 0
    for n in (1, 2, 3):
        key.apply(ledger, {"n": n})  # seqs 1, 2, 3
    p = ledger.projection
    assert [key.read(p, at=q) for q in (-1, 0, 1, 2, 3, 99)] \
        == [[], [], [1], [1, 2], [1, 2, 3], [1, 2, 3]]
    assert key.read(p) == [1, 2, 3]


def test_the_cache_follows_events_appended_by_any_route() -> None:
    """The value always equals the fold of the ledger's lines: an update, then events of the
    same key recorded another way (a second StateKey object, or the plugin-event API), are
    all folded."""
    key: StateKey[Any] = StateKey("app", "pins-route", [], append)
    twin: StateKey[Any] = StateKey("app", "pins-route", [], append)
    ledger = Ledger("s-route")
    assert key.apply(ledger, {"n": 1}) == [1]
    assert ledger.projection.states is not None
    ledger.append(PluginEvent, plugin="app", name="pins-route", data={"n": 2})
    assert key.read(ledger.projection) == [1, 2]
    assert key.read(ledger.projection) == [1, 2]  # cached: the same again
    assert twin.apply(ledger, {"n": 3}) == [1, 2, 3]
    ledger.append(PluginEvent, plugin="app", name="pins-route", data={"n": 4})
    assert key.apply(ledger, {"n": 5}) == [1, 2, 3, 4, 5]
    ledger.append(PluginEvent, plugin="app", name="pins-route", data={"n": 6})
    assert key.read(ledger.projection) == [1, 2, 3, 4, 5, 6]
    assert twin.read(ledger.projection) == [1, 2, 3, 4, 5, 6]
    fresh = Projection()
    for event in ledger.projection.plugin_index[("app", "pins-route")]:  # type: ignore[index]
        fresh.apply(event)
    assert key.read(fresh) == [1, 2, 3, 4, 5, 6]


def test_a_read_folds_only_what_is_new_and_caches_it_on_the_projection() -> None:
    calls: list[int] = []

    def counting(state: int, data: Mapping[str, Any]) -> int:
        calls.append(data["by"])
        return state + data["by"]

    key: StateKey[Any] = StateKey("app", "pins-calls", 0, counting)
    ledger = Ledger("s-calls")
    for n in (1, 2, 3):
        ledger.append(PluginEvent, plugin="app", name="pins-calls", data={"by": n})
    assert ledger.projection.states is None
    assert key.read(ledger.projection) == 6 and calls == [1, 2, 3]
    assert ledger.projection.states == {key: (3, 6)}
    assert key.read(ledger.projection) == 6 and calls == [1, 2, 3]
    ledger.append(PluginEvent, plugin="app", name="pins-calls", data={"by": 10})
    assert key.read(ledger.projection) == 16 and calls == [1, 2, 3, 10]
    assert key.read(ledger.projection, at=1) == 3  # at= folds afresh, caches nothing
    assert ledger.projection.states == {key: (4, 16)}


def test_updating_one_key_keeps_the_cached_values_of_the_others() -> None:
    """Each event is folded once per process: an update of one key does not make another
    key's next read fold its events again."""
    calls: list[str] = []

    def counting(name: str) -> Any:
        def reduce(state: int, data: Mapping[str, Any]) -> int:
            calls.append(name)
            return state + 1
        return reduce

    a: StateKey[Any] = StateKey("app", "pins-a", 0, counting("a"))
    b: StateKey[Any] = StateKey("app", "pins-b", 0, counting("b"))
    ledger = Ledger("s-two")
    ledger.append(PluginEvent, plugin="app", name="pins-a", data={})
    ledger.append(PluginEvent, plugin="app", name="pins-a", data={})
    assert a.read(ledger.projection) == 2 and calls == ["a", "a"]
    assert b.apply(ledger) == 1 and b.apply(ledger) == 2
    assert a.read(ledger.projection) == 2 and b.read(ledger.projection) == 2
    assert calls == ["a", "a", "b", "b"]
    assert ledger.projection.states == {a: (2, 2), b: (2, 2)}


def test_a_recorded_event_the_reducer_now_refuses_names_its_seq() -> None:
    key: StateKey[Any] = StateKey("pins-r", "strict", 0, add)
    ledger = Ledger("s-strict")
    key.apply(ledger, {"by": 2})  # seq 0
    ledger.append(PluginEvent, plugin="pins-r", name="strict", data={"by": "two"})  # seq 1
    with pytest.raises(StateError) as info:
        key.read(ledger.projection)
    assert str(info.value) == ("state pins-r/strict (event seq 1): the reducer raised "
                               "ValueError: invalid literal for int() with base 10: 'two'")
    assert info.value.plugin == "pins-r"
    assert isinstance(info.value.__cause__, ValueError)
    assert key.read(ledger.projection, at=0) == 2


# ------------------------------------------------------------------ "$state"


def test_a_state_update_sets_the_value_without_the_reducer() -> None:
    calls: list[Any] = []

    def reducer(state: Any, data: Mapping[str, Any]) -> Any:
        calls.append(dict(data))
        return {"seen": dict(data)}

    key: StateKey[Any] = StateKey("app", "pins-set", {}, reducer)
    ledger = Ledger("s-set")
    assert key.apply(ledger, {"$state": {"a": [1, 2]}}) == {"a": [1, 2]}
    assert calls == []
    assert key.apply(ledger, {"$state": None}) is None
    assert calls == []
    # "$state" with anything else beside it is an ordinary update: the reducer gets it all
    assert key.apply(ledger, {"$state": 1, "x": 2}) == {"seen": {"$state": 1, "x": 2}}
    assert key.apply(ledger, {"x": 3}) == {"seen": {"x": 3}}
    assert calls == [{"$state": 1, "x": 2}, {"x": 3}]
    fresh = Projection()
    for event in ledger.projection.plugin_index[("app", "pins-set")]:  # type: ignore[index]
        fresh.apply(event)
    calls.clear()
    assert key.read(fresh) == {"seen": {"x": 3}} and len(calls) == 2
    assert key.read(fresh, at=0) == {"a": [1, 2]} and key.read(fresh, at=1) is None


def test_a_recorded_state_value_that_is_not_json_is_refused_naming_its_seq() -> None:
    """A ``$state`` line written by hand (Python's json reads ``Infinity``) is not trusted:
    reading the key says which event, and the value before it is still readable."""
    key: StateKey[Any] = StateKey("pins-s", "inf", 0, add)
    ledger = Ledger("s-inf")
    key.apply(ledger, {"by": 1})  # seq 0
    ledger.append(PluginEvent, plugin="pins-s", name="inf", data={"$state": float("inf")})
    with pytest.raises(StateError) as info:
        key.read(ledger.projection)
    assert str(info.value) == ("state pins-s/inf (event seq 1) is inf, which JSON cannot "
                               "represent")
    assert info.value.plugin == "pins-s"
    assert key.read(ledger.projection, at=0) == 1


def test_a_state_update_is_still_held_to_max_bytes() -> None:
    key: StateKey[Any] = StateKey("app", "pins-setcap", 0, add, max_bytes=10)
    ledger = Ledger("s-setcap")
    with pytest.raises(StateError, match="the update makes the value 12 bytes"):
        key.apply(ledger, {"$state": "x" * 10})
    assert ledger.projection.seq == -1


# ------------------------------------------------------------------ writing


def test_an_update_records_the_data_and_the_keys_version() -> None:
    key: StateKey[Any] = StateKey("app", "pins-ver", 0, add, version=3)
    ledger = Ledger("s-ver")
    assert key.apply(ledger, {"by": 4}) == 4
    assert key.apply(ledger) == 5  # no data: {} (the reducer's default step)
    [first, second] = ledger.projection.plugin_index[("app", "pins-ver")]  # type: ignore[index]
    assert (first.plugin, first.name, first.data, first.version) == ("app", "pins-ver",
                                                                     {"by": 4}, 3)
    assert (second.data, second.version) == ({}, 3)


def test_bad_update_data_names_the_event() -> None:
    key: StateKey[Any] = StateKey("pins-d", "data", 0, add)
    ledger = Ledger("s-data")
    with pytest.raises(PluginEventError, match=r"x/pins-d/data"):
        key.apply(ledger, {"by": {1, 2}})
    with pytest.raises(PluginEventError, match=r"x/pins-d/data.*must be a JSON object"):
        key.apply(ledger, [1])  # type: ignore[arg-type]
    assert ledger.projection.seq == -1


@pytest.mark.parametrize(("reducer", "message"), [
    (lambda s, d: 1 // 0,
     "state pins-b/bad: the reducer raised ZeroDivisionError: integer division or modulo by "
     "zero"),
    (lambda s, d: d.update(x=1),
     "state pins-b/bad: the reducer raised TypeError: a request's mappings are read-only "
     "(MISSION C3); build a new request with attrs.evolve and write what you add to the "
     "ledger (the state is read-only: return a new value)"),
    (lambda s, d: s.append(1),
     "state pins-b/bad: the reducer raised TypeError: a request's lists are read-only "
     "(MISSION C3); build a new request with attrs.evolve and write what you add to the "
     "ledger (the state is read-only: return a new value)"),
    (lambda s, d: s + 1,
     "state pins-b/bad: the reducer raised TypeError: can only concatenate list (not "
     "\"int\") to list"),
    (lambda s, d: (_ for _ in ()).throw(KeyError("read-only")),
     "state pins-b/bad: the reducer raised KeyError: 'read-only'"),
    (lambda s, d: {"v": {1}},
     "state pins-b/bad: the reducer returned a value that at ['v'] is a set, not JSON (use "
     "None, bool, int, float, str, lists and dicts)"),
    (lambda s, d: float("nan"),
     "state pins-b/bad: the reducer returned a value that is nan, which JSON cannot "
     "represent"),
])
def test_a_bad_reducer_is_reported_exactly_and_records_nothing(reducer: Any,
                                                                message: str) -> None:
    key: StateKey[Any] = StateKey("pins-b", "bad", [], reducer)
    ledger = Ledger("s-bad")
    with pytest.raises(StateError) as info:
        key.apply(ledger, {"x": 1})
    assert str(info.value) == message
    assert info.value.plugin == "pins-b"
    assert ledger.projection.seq == -1 and key.read(ledger.projection) == []


def test_max_bytes_is_the_size_of_the_value_as_compact_utf8_json() -> None:
    """A value of exactly max_bytes is kept, one byte more is refused; the size counts UTF-8
    bytes of compact JSON (no spaces, non-ASCII as itself, not as \\u escapes)."""
    value = {"a": ["é", 1], "b": "x"}
    size = _json_size(value)
    assert size == 22  # {"a":["é",1],"b":"x"}: 21 characters, é as two bytes
    key: StateKey[Any] = StateKey("app", "pins-cap", None, lambda s, d: d["v"], max_bytes=size)
    ledger = Ledger("s-cap")
    assert key.apply(ledger, {"v": value}) == value
    bigger = {"a": ["é", 1], "b": "xy"}
    with pytest.raises(StateError) as info:
        key.apply(ledger, {"v": bigger})
    assert str(info.value) == ("state app/pins-cap: the update makes the value 23 bytes as "
                               "JSON; the limit is 22 (nothing was recorded)")
    assert info.value.plugin == "app"
    assert key.read(ledger.projection) == value
    assert len(ledger.projection.plugin_index[("app", "pins-cap")]) == 1  # type: ignore[index]


def test_a_frozen_value_that_is_not_json_is_refused_as_a_state_error() -> None:
    """A reducer may build its value with dsh's ``freeze``, which keeps other objects as they
    are: what is not JSON inside it is refused like any other value, not a raw TypeError."""
    key: StateKey[Any] = StateKey("pins-f", "frozen", {}, lambda s, d: freeze({"when": {1, 2}}))
    ledger = Ledger("s-frozen")
    with pytest.raises(StateError,
                       match=r"^state pins-f/frozen: the reducer returned a value that is "
                             r"not JSON") as info:
        key.apply(ledger, {})
    assert info.value.plugin == "pins-f"
    nan: StateKey[Any] = StateKey("pins-f", "nan", {}, lambda s, d: freeze({"x": float("nan")}))
    with pytest.raises(StateError, match="is not JSON"):
        nan.apply(ledger, {})
    assert ledger.projection.seq == -1


# ------------------------------------------------------------------ which plugin may update


class _Only:
    pass


def test_with_an_app_the_plugin_must_be_the_apps_or_the_agents(tmp_path: Path) -> None:
    from dsh.run.app import App

    app = App.from_config({"autoload": False, "model": "echo",
                           "sessions_dir": str(tmp_path / "sessions")})
    pm = pluggy.PluginManager("dsh")
    pm.register(_Only(), name="pins-agent-only")
    ledger = Ledger("s-app")
    key: StateKey[Any] = StateKey("pins-agent-only", "n", 0, add)
    with pytest.raises(StateError) as info:
        key.apply(ledger, {"by": 2}, app=app)
    assert str(info.value) == ("state x/pins-agent-only/n: no plugin 'pins-agent-only' is "
                               "registered in this app")
    assert info.value.plugin == "pins-agent-only" and ledger.projection.seq == -1
    assert key.apply(ledger, {"by": 2}, app=app, pm=pm) == 2  # the agent's own plugin
    assert key.apply(ledger, {"by": 1}) == 3  # no app: no check (a ledger by hand)
    assert StateKey("app", "pins-n", 0, add).apply(ledger, {"by": 5}, app=app) == 5


# ------------------------------------------------------------------ inside a run


def test_get_and_update_in_a_run_without_a_session_use_its_ledger() -> None:
    key: StateKey[Any] = StateKey("pins-anyplugin", "n", 0, add, version=2)
    ledger = Ledger("s-run")
    with activate(RunContext(run_id="r", agent="a", ledger=ledger)):
        assert key.get() == 0
        assert key.update({"by": 3}) == 3  # no Session, so no app to check against
        assert key.update() == 4
        assert key.get() == 4
    [e1, e2] = ledger.projection.plugin_index[("pins-anyplugin", "n")]  # type: ignore[index]
    assert (e1.data, e2.data, e1.version) == ({"by": 3}, {}, 2)


def test_update_in_a_session_run_goes_through_the_session(tmp_path: Path) -> None:
    """Inside a Session's run, update checks the plugin against the app (as
    session.update_state does) and the value is the session's."""
    from dsh.run.app import App

    app = App.from_config({"autoload": False, "model": "echo",
                           "sessions_dir": str(tmp_path / "sessions")})
    key: StateKey[Any] = StateKey("app", "pins-sess", 0, add)
    stranger = StateKey("pins-stranger", "n", 0, add)
    with app.session() as s:
        with activate(RunContext(run_id="r", agent="default", ledger=s.ledger, session=s)):
            assert key.update({"by": 2}) == 2
            assert key.get() == 2
            with pytest.raises(StateError, match="no plugin 'pins-stranger' is registered"):
                stranger.update({"by": 1})
        assert s.state(key) == 2 and s.state(stranger) == 0
