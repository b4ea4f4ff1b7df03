"""The plugin API of issue 11: one agent handle on every hook argument, typed stashes at app,
agent, session and run scope, and ``turn_stopping``'s final response and counter.

Plugins here are real: modules loaded by ``load = [...]``, or a distribution found through its
``dsh`` entry point (the stranger's plugin), run against the scripted model.
"""

from __future__ import annotations

import itertools
import json
import sys
import textwrap
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dsh
from dsh.config.loader import config_from_dict
from dsh.core.errors import NoRunContext
from dsh.hookspecs import hookimpl
from dsh.host.scope import AgentHandle
from dsh.host.scope import AgentInfo
from dsh.host.scope import NotInRun
from dsh.host.stash import Stash
from dsh.host.stash import StashKey
from dsh.run.app import App


def _events(path: Path | None) -> list[dict[str, Any]]:
    assert path is not None
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- Stash ------------------------------------------------------------------------------------


def test_stash_is_typed_storage_keyed_by_identity() -> None:
    count, names = StashKey[int](), StashKey[list[str]]()
    other_count = StashKey[int]()
    stash = Stash()
    assert count not in stash and len(stash) == 0
    assert stash.get(count, None) is None
    with pytest.raises(KeyError):
        stash[count]
    stash[count] = 1
    assert stash[count] == 1 and count in stash and other_count not in stash
    first = stash.setdefault(names, ["a"])
    assert stash.setdefault(names, ["b"]) is first == ["a"]
    stash[other_count] = 7
    assert stash[count] == 1, "two keys made alike are still two keys"
    del stash[count]
    assert count not in stash and stash.get(count, 0) == 0 and len(stash) == 2
    with pytest.raises(KeyError):
        del stash[count]
    assert dsh.Stash is Stash and dsh.StashKey is StashKey and dsh.AgentHandle is AgentHandle


@given(st.lists(st.tuples(st.sampled_from(["set", "del", "setdefault", "get"]),
                          st.integers(0, 3), st.integers())))
def test_stash_behaves_like_a_dict_of_its_keys(ops: list[tuple[str, int, int]]) -> None:
    keys = [StashKey[int]() for _ in range(4)]
    stash, model = Stash(), {}
    for op, k, value in ops:
        key = keys[k]
        if op == "set":
            stash[key] = model[k] = value
        elif op == "del":
            if k in model:
                del stash[key], model[k]
            else:
                with pytest.raises(KeyError):
                    del stash[key]
        elif op == "setdefault":
            assert stash.setdefault(key, value) == model.setdefault(k, value)
        else:
            assert stash.get(key, None) == model.get(k)
        assert len(stash) == len(model)
        assert all((keys[i] in stash) == (i in model) for i in range(4))


# -- one handle per agent per app -------------------------------------------------------------

AGENT_RUNS = StashKey[int]()
APP_RUNS = StashKey[int]()
SESSION_RUNS = StashKey[int]()


def _counting_plugin(plugin_module: Callable[..., str]) -> str:
    @hookimpl
    def pre_step(step):  # type: ignore[no-untyped-def]
        for stash, key in ((step.handle.stash, AGENT_RUNS), (step.handle.app_stash, APP_RUNS),
                           (step.handle.session_stash, SESSION_RUNS)):
            stash[key] = stash.get(key, 0) + 1

    return plugin_module(pre_step=pre_step)


def test_two_apps_with_the_same_agent_names_keep_separate_state(
        tmp_path: Path, plugin_module: Callable[..., str]) -> None:
    name = _counting_plugin(plugin_module)
    config = {"autoload": False, "load": [name], "model": "echo", "agents": {"a": {}, "b": {}},
              "agent": "a"}
    one = App(config_from_dict({**config, "sessions_dir": str(tmp_path / "one")}))
    two = App(config_from_dict({**config, "sessions_dir": str(tmp_path / "two")}))
    assert one.agent("a").handle is not two.agent("a").handle
    assert one.agent("a").handle is one.agent("a").info  # AgentInfo: the old name
    assert AgentInfo is AgentHandle

    with one.session("a") as s1:
        s1.send("first")
        s1.send("second")
    with one.session("b") as s2:
        s2.send("third")
    with two.session("a") as s3:
        s3.send("elsewhere")

    assert one.agent("a").handle.stash[AGENT_RUNS] == 2
    assert one.agent("b").handle.stash[AGENT_RUNS] == 1
    assert two.agent("a").handle.stash[AGENT_RUNS] == 1, "another app's agent 'a' is separate"
    assert AGENT_RUNS not in two.agent("b").handle.stash
    assert one.stash[APP_RUNS] == 3 and two.stash[APP_RUNS] == 1
    assert one.agent("a").handle.app_stash is one.stash
    assert (s1.stash[SESSION_RUNS], s2.stash[SESSION_RUNS], s3.stash[SESSION_RUNS]) == (2, 1, 1)
    # A variant of the agent with overrides is still that agent of that app: same stash.
    variant = one.agent("a", system="terse")
    assert variant.handle is not one.agent("a").handle
    assert variant.handle.stash is one.agent("a").handle.stash


def test_a_resumed_session_object_starts_with_an_empty_session_stash(
        make_app: Callable[..., App], plugin_module: Callable[..., str]) -> None:
    app = make_app(load=[_counting_plugin(plugin_module)], model="echo")
    with app.session() as s:
        s.send("one")
        sid = s.id
        assert s.stash[SESSION_RUNS] == 1
    with app.session(session_id=sid) as again:
        again.send("two")
        assert again.stash[SESSION_RUNS] == 1  # in memory, per Session object (documented)
    assert app.agent().handle.stash[AGENT_RUNS] == 2


# -- the handle from every hook --------------------------------------------------------------

SEEN_RUN = StashKey[list[str]]()


def test_every_hook_reaches_the_handle_settings_and_stashes(
        make_app: Callable[..., App], plugin_module: Callable[..., str],
        script: Callable[..., str]) -> None:
    seen: list[tuple[str, Any, str, Stash, Stash]] = []
    name_box: list[str] = []

    def record(hook: str, handle: AgentHandle) -> None:
        colour = handle.plugin_settings(name_box[0])["colour"]
        seen.append((hook, handle, colour, handle.session_stash, handle.run_stash))
        handle.run_stash.setdefault(SEEN_RUN, []).append(hook)

    @hookimpl
    def register_tools(register, agent):  # type: ignore[no-untyped-def]
        record_assembly.append(agent)

        def read(n: int) -> str:
            """Read a chunk.

            :param n: which chunk
            """
            return f"chunk {n}: " + "x" * 600

        register(read)

    record_assembly: list[AgentHandle] = []

    @hookimpl
    def pre_step(step):  # type: ignore[no-untyped-def]
        record("pre_step", step.handle)

    @hookimpl(wrapper=True)
    def request(call):  # type: ignore[no-untyped-def]
        record("request", call.handle)
        return (yield)

    @hookimpl
    def pre_execute(call):  # type: ignore[no-untyped-def]
        record("pre_execute", call.handle)

    @hookimpl(wrapper=True)
    def execute(call):  # type: ignore[no-untyped-def]
        record("execute", call.handle)
        return (yield)

    @hookimpl
    def post_execute(call, outcome):  # type: ignore[no-untyped-def]
        record("post_execute", call.handle)

    @hookimpl
    def turn_stopping(turn):  # type: ignore[no-untyped-def]
        record("turn_stopping", turn.handle)
        assert turn.session.stash is turn.handle.session_stash

    @hookimpl
    def compact_context(request):  # type: ignore[no-untyped-def]
        record("compact_context", request.handle)
        assert dsh.context().handle is request.handle

    name = plugin_module(register_tools=register_tools, pre_step=pre_step, request=request,
                         pre_execute=pre_execute, execute=execute, post_execute=post_execute,
                         turn_stopping=turn_stopping, compact_context=compact_context)
    name_box.append(name)
    reads = [{"tool_calls": [{"name": "read", "arguments": {"n": i}}]} for i in range(6)]
    app = make_app(load=[name], compaction="mask", context_window=1000,
                   model=script(*reads, {"text": "done"}),
                   plugins={name: {"colour": "red"}},
                   agents={"default": {"plugin_settings": {name: {"colour": "blue"}}}})
    with app.session() as session:
        result = session.send("read everything")
    assert result.outcome == "completed", result.reason
    handle = app.agent().handle
    assert record_assembly == [handle] and record_assembly[0] is handle
    hooks = {hook for hook, *_ in seen}
    assert hooks == {"pre_step", "request", "pre_execute", "execute", "post_execute",
                     "turn_stopping", "compact_context"}
    assert all(h is handle for _, h, *_ in seen), "one handle object everywhere"
    assert {colour for _, _, colour, *_ in seen} == {"blue"}, "the agent's own override wins"
    assert all(s is session.stash for *_, s, _ in seen)
    run_stashes = {id(r) for *_, r in seen}
    assert len(run_stashes) == 1
    assert seen[0][4][SEEN_RUN] == [hook for hook, *_ in seen]
    # The run stash lives as long as the run: the next send gets a new one.
    with app.session(session_id=result.session_id) as again:
        again.send("and again?")
    assert seen[-1][4] is not seen[0][4] and seen[-1][3] is again.stash


def test_run_stash_and_session_stash_outside_a_run_are_clear_errors(
        make_app: Callable[..., App], plugin_module: Callable[..., str]) -> None:
    app = make_app(model="echo", agents={"a": {}, "b": {}}, agent="a")
    handle = app.agent("a").handle
    for what in ("session_stash", "run_stash"):
        with pytest.raises(NotInRun, match=rf"agent 'a': {what} is only available during a "
                                           r"run of this agent, and was used outside any run"):
            getattr(handle, what)
    assert issubclass(NotInRun, RuntimeError) and issubclass(NotInRun, NoRunContext)
    assert handle.stash is app.agent("a").handle.stash  # agent and app scope work anywhere
    assert handle.app_stash is app.stash

    # Inside a run of another agent, agent a's run-scoped stashes are refused too: they
    # would otherwise be b's.
    errors: list[str] = []

    @hookimpl
    def pre_step(step):  # type: ignore[no-untyped-def]
        try:
            _ = handle.session_stash
        except NotInRun as exc:
            errors.append(str(exc))
        assert step.handle.session_stash is not None

    app2 = make_app(model="echo", agents={"a": {}, "b": {}}, agent="a",
                    load=[plugin_module(pre_step=pre_step)])
    handle = app2.agent("a").handle
    result = app2.run("hi", agent="b")
    assert result.outcome == "completed", result.reason
    assert errors and "in a run of another agent or App (agent 'b')" in errors[0]


def test_a_handle_from_a_thread_without_the_run_context_says_how_to_fix_it(
        make_app: Callable[..., App], plugin_module: Callable[..., str]) -> None:
    caught: list[BaseException] = []

    @hookimpl
    def pre_step(step):  # type: ignore[no-untyped-def]
        def worker() -> None:
            try:
                _ = step.handle.run_stash
            except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
                caught.append(exc)

        t = threading.Thread(target=worker)
        t.start()
        t.join()

    app = make_app(model="echo", load=[plugin_module(pre_step=pre_step)])
    assert app.run("hi").outcome == "completed"
    assert isinstance(caught[0], NotInRun)
    assert "contextvars.copy_context().run" in str(caught[0])


# -- turn_stopping: the final response and the counter --------------------------------------


def test_turn_stopping_receives_the_final_response_and_the_counter(
        make_app: Callable[..., App], plugin_module: Callable[..., str],
        script: Callable[..., str]) -> None:
    calls: list[tuple[int, str, tuple[str, ...], int]] = []

    @hookimpl
    def turn_stopping(turn):  # type: ignore[no-untyped-def]
        r = turn.response
        calls.append((turn.stopping_calls, r.text, tuple(c.name for c in r.tool_calls),
                      r.usage.output_tokens))
        return "one more, please" if turn.stopping_calls == 1 else None

    model = script({"text": "first answer", "usage": {"input_tokens": 3, "output_tokens": 5}},
                   {"text": "second answer", "usage": {"input_tokens": 4, "output_tokens": 9}})
    app = make_app(model=model, load=[plugin_module(turn_stopping=turn_stopping)])
    result = app.run("go")
    assert result.outcome == "completed" and result.output == "second answer"
    assert calls == [(1, "first answer", (), 5), (2, "second answer", (), 9)]
    follow = [e for e in _events(result.path) if e["type"] == "user/message"][1]
    assert follow["text"] == "one more, please" and follow["source"].startswith("plugin:")


def test_turn_stopping_without_a_step_has_no_response(
        make_app: Callable[..., App], plugin_module: Callable[..., str]) -> None:
    seen: list[Any] = []

    @hookimpl
    def turn_stopping(turn):  # type: ignore[no-untyped-def]
        seen.append((turn.stopping_calls, turn.response, turn.steps))

    app = make_app(model="echo", load=[plugin_module(turn_stopping=turn_stopping)])
    assert app.run("   ").outcome == "completed"
    assert seen == [(1, None, 0)]


def test_turn_stopping_first_answer_wins_and_the_others_answer_at_the_next_stop(
        make_app: Callable[..., App], plugin_module: Callable[..., str]) -> None:
    """firstresult: two plugins each ask for one follow-up; both get theirs, one per stop."""

    def asker(text: str) -> Callable[..., Any]:
        asked = StashKey[bool]()

        @hookimpl
        def turn_stopping(turn):  # type: ignore[no-untyped-def]
            if asked in turn.handle.run_stash:
                return None
            turn.handle.run_stash[asked] = True
            return text

        return turn_stopping

    first = plugin_module(turn_stopping=asker("from the first"))
    second = plugin_module(turn_stopping=asker("from the second"))
    app = make_app(model="echo", load=[first, second])
    result = app.run("go")
    assert result.outcome == "completed", result.reason
    follow = [(e["text"], e["source"]) for e in _events(result.path)
              if e["type"] == "user/message"][1:]
    # Later registered is called first (pluggy's order).
    assert follow == [("from the second", f"plugin:{second}"),
                      ("from the first", f"plugin:{first}")]


# -- concurrency ------------------------------------------------------------------------------

CALLS = StashKey[list[tuple[str, int]]]()
COUNTER = StashKey["itertools.count[int]"]()
LOCK = StashKey[threading.Lock]()


def test_stash_under_concurrent_parallel_tool_calls(
        make_app: Callable[..., App], plugin_module: Callable[..., str],
        script: Callable[..., str]) -> None:
    n = 8
    barrier = threading.Barrier(n, timeout=30)
    threads: set[str] = set()

    def work(i: int) -> str:
        """Work.

        :param i: which
        """
        barrier.wait()  # every call is running at once before any touches the stash
        threads.add(threading.current_thread().name)
        handle = dsh.context().handle
        stash = handle.session_stash
        lock = stash.setdefault(LOCK, threading.Lock())
        with lock:
            stash.setdefault(CALLS, []).append(("tool", i))
        next(stash.setdefault(COUNTER, itertools.count(1)))
        return str(i)

    @hookimpl
    def register_tools(register):  # type: ignore[no-untyped-def]
        register(work)

    @hookimpl
    def post_execute(call, outcome):  # type: ignore[no-untyped-def]
        stash = call.handle.session_stash
        with stash.setdefault(LOCK, threading.Lock()):
            stash.setdefault(CALLS, []).append(("post", int(outcome.output)))

    calls = [{"name": "work", "arguments": {"i": i}} for i in range(n)]
    app = make_app(model=script({"tool_calls": calls}, {"text": "done"}),
                   load=[plugin_module(register_tools=register_tools,
                                       post_execute=post_execute)])
    with app.session() as session:
        result = session.send("go")
    assert result.outcome == "completed", result.reason
    assert len(threads) == n and all(t.startswith("dsh-tool") for t in threads)
    assert sorted(session.stash[CALLS]) == sorted(
        [("tool", i) for i in range(n)] + [("post", i) for i in range(n)])
    assert next(session.stash[COUNTER]) == n + 1, "every call counted exactly once"


# -- the stranger's plugin --------------------------------------------------------------------

STRANGER = '''
"""dsh-stranger: a third-party plugin written from docs/plugins.md alone (issue 11)."""

import json

import dsh
from dsh import hookimpl

NAME = "stranger"
REQUESTS = dsh.StashKey[int]()


def lookup(key: str) -> str:
    """Look a record up.

    :param key: the record's key.
    """
    return json.dumps({"key": key, "value": "v-" + key, "api_key": "AK" + key,
                       "internal_id": 42})


@hookimpl
def register_tools(register, agent):
    register(lookup)


@hookimpl
def pre_step(step):
    settings = step.handle.plugin_settings(NAME)
    for word in settings.get("banned", []):
        if word in step.text:
            step.reject(f"the message mentions {word!r}")
            return
    step.text = step.text.replace("colour", "color")


@hookimpl
def post_execute(call, outcome):
    keys = call.handle.plugin_settings(NAME).get("redact_keys", [])
    try:
        data = json.loads(outcome.output)
    except ValueError:
        return
    if isinstance(data, dict):
        outcome.output = json.dumps({k: v for k, v in data.items() if k not in keys})


@hookimpl(wrapper=True)
def request(call):
    stash = call.handle.session_stash
    stash[REQUESTS] = stash.get(REQUESTS, 0) + 1
    return (yield)


@hookimpl
def turn_stopping(turn):
    follow_up = turn.handle.plugin_settings(NAME).get("follow_up")
    if follow_up and turn.stopping_calls == 1 and turn.response is not None:
        return follow_up
    return None
'''


@pytest.fixture
def stranger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The stranger's plugin as a distribution with a ``dsh`` entry point, found for real."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "dsh_stranger.py").write_text(textwrap.dedent(STRANGER))
    info = site / "dsh_stranger-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dsh-stranger\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[dsh]\nstranger = dsh_stranger\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "dsh_stranger", raising=False)
    monkeypatch.setenv("DSH_LOAD_PLUGINS", "stranger")  # not the first-party ones installed
    import dsh_stranger  # type: ignore[import-not-found]

    return dsh_stranger  # type: ignore[no-any-return]


def test_the_strangers_plugin_works_from_the_docs_without_globals(
        tmp_path: Path, stranger: types.ModuleType, script: Callable[..., str]) -> None:
    writer_model = script(
        {"tool_calls": [{"name": "lookup", "arguments": {"key": "a"}}]},
        {"text": "The value is v-a."},
        {"text": "Nothing else."},  # the follow-up turn_stopping asked for
        {"text": "ok"},
        {"text": "still nothing"},
    )
    app = App(config_from_dict({
        "sessions_dir": str(tmp_path / "sessions"), "agent": "writer",
        "plugins": {"stranger": {"redact_keys": ["api_key", "internal_id"],
                                 "follow_up": "Anything else?"}},
        "agents": {
            "writer": {"model": writer_model, "plugins": ["stranger"],
                       "plugin_settings": {"stranger": {"banned": ["forbidden"]}}},
            "chat": {"model": "echo", "plugins": []},
        },
    }))
    with app.session("writer") as session:
        first = session.send("what is the colour of a?")
        rejected = session.send("a forbidden question")
        third = session.send("my colour")
    assert first.outcome == "completed" and first.output == "Nothing else.", first.reason
    assert rejected.outcome == "rejected" and "'forbidden'" in rejected.reason
    assert third.outcome == "completed" and third.output == "still nothing", third.reason
    events = _events(first.path)
    users = [(e["text"], e["source"]) for e in events if e["type"] == "user/message"]
    assert users == [("what is the color of a?", "user"),
                     ("Anything else?", "plugin:stranger"),
                     ("my color", "user"), ("Anything else?", "plugin:stranger")]
    outputs = [e["output"] for e in events if e["type"] == "tool/result"]
    assert outputs == [json.dumps({"key": "a", "value": "v-a"})]
    rejection = next(e for e in events if e["type"] == "step/rejected")
    assert rejection["plugin"] == "stranger"
    # Requests per session, counted in the session's stash: 3 + 2 here, 3 in a new session.
    assert session.stash[stranger.REQUESTS] == 5
    with app.session("writer") as other:
        other.send("the colour again")
    assert other.stash[stranger.REQUESTS] == 3
    assert session.stash[stranger.REQUESTS] == 5

    # Enabled for one agent only: `chat` gets no rewrite, no rejection, no tool, no count.
    with app.session("chat") as chat:
        plain = chat.send("a forbidden colour")
    assert plain.outcome == "completed" and plain.output.endswith("a forbidden colour")
    assert "lookup" not in app.agent("chat").tools
    assert stranger.REQUESTS not in chat.stash

    # No module globals holding state: only functions, constants and stash keys.
    state = {k: v for k, v in vars(stranger).items() if not k.startswith("__")
             and isinstance(v, dict | list | set | int | float)}
    assert state == {}, state


# -- plugin events through the handle (delegators to dsh.plugin_events) ----------------------


def test_the_handle_records_and_reads_plugin_events_across_apps(
        tmp_path: Path, plugin_module: Callable[..., str]) -> None:
    box: list[str] = []
    read: list[list[tuple[str, dict[str, Any], int]]] = []

    @hookimpl
    def pre_step(step):  # type: ignore[no-untyped-def]
        events = step.handle.plugin_events(box[0], "stopped")
        read.append([(e.name, dict(e.data), e.version) for e in events])

    @hookimpl
    def turn_stopping(turn):  # type: ignore[no-untyped-def]
        turn.handle.record_event(box[0], "stopped", {"calls": turn.stopping_calls,
                                                     "text": turn.response.text}, version=2)

    box.append(plugin_module(pre_step=pre_step, turn_stopping=turn_stopping))
    config = {"autoload": False, "load": box, "model": "echo",
              "sessions_dir": str(tmp_path / "sessions")}
    first = App(config_from_dict(config)).run("hello")
    assert first.outcome == "completed", first.reason
    # Another App (as after a restart) resuming the session reads what the first one wrote.
    again = App(config_from_dict(config)).run("again", session=first.session_id)
    assert again.outcome == "completed", again.reason
    assert read == [[], [("stopped", {"calls": 1, "text": "hello"}, 2)]]
    types_ = [e["type"] for e in _events(again.path)]
    assert types_.count(f"x/{box[0]}/stopped") == 2
    handle = App(config_from_dict(config)).agent().handle
    with pytest.raises(RuntimeError):
        handle.record_event(box[0], "stopped", {})
    with pytest.raises(RuntimeError):
        handle.plugin_events(box[0])


def test_a_handle_kept_from_one_app_does_not_reach_another_apps_run(
        make_app: Callable[..., App], plugin_module: Callable[..., str]) -> None:
    """A plugin that (wrongly) kept app one's handle in a global and uses it during app two's
    run of the same agent name gets an error, not app two's session state."""
    kept: list[AgentHandle] = []
    outcomes: list[str] = []

    @hookimpl
    def pre_step(step):  # type: ignore[no-untyped-def]
        if not kept:
            kept.append(step.handle)
            return
        try:
            kept[0].session_stash[SESSION_RUNS] = 99
            outcomes.append("reached")
        except NotInRun as exc:
            outcomes.append(str(exc))

    name = plugin_module(pre_step=pre_step)
    one, two = make_app(model="echo", load=[name]), make_app(model="echo", load=[name])
    assert one.run("first").outcome == "completed"
    with two.session() as session:
        assert session.send("second").outcome == "completed"
    assert SESSION_RUNS not in session.stash
    assert outcomes and "another agent or App (agent 'default')" in outcomes[0]
