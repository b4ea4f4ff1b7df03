"""Recorded state (issue 25): StateKey folds plugin events; the read-only session reader; the
built-in dsh.tasks / dsh.memory; the outsider's warden plugin without workarounds."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.core.errors import InputDroppedWarning
from dsh.core.errors import UsageError
from dsh.ledger.history import Projection
from dsh.ledger.plugin_events import OutsideRun
from dsh.ledger.plugin_events import PluginEventError
from dsh.ledger.reader import open_session
from dsh.ledger.state import StateError
from dsh.ledger.state import StateKey
from dsh.ledger.store import JsonlStore
from dsh.run.app import App

REPO = Path(__file__).resolve().parent.parent


def add(state: int, data: Mapping[str, Any]) -> int:
    return state + int(data.get("by", 1))


COUNT: StateKey[int] = StateKey("app", "count", 0, add)


def app_for(tmp: Path, **extra: Any) -> App:
    return App.from_config({"autoload": False, "model": "echo",
                            "sessions_dir": str(tmp / "sessions"), **extra})


def test_updates_fold_and_survive_a_new_session_object_and_app(tmp_path: Path) -> None:
    app = app_for(tmp_path)
    with app.session() as s:
        assert s.state(COUNT) == 0
        assert s.update_state(COUNT, {"by": 2}) == 2
        assert s.update_state(COUNT, {"by": 3}) == 5
        sid = s.id
    # a new App (what a new process has): folded from the file, once
    with app_for(tmp_path).session(None, sid) as again:
        assert again.state(COUNT) == 5
        assert again.update_state(COUNT) == 6
    reader = open_session(tmp_path / "sessions", sid[:12])
    assert reader.state(COUNT) == 6
    seqs = [e.seq for e in reader.plugin_events("app", "count")]
    assert [reader.state(COUNT, at=q) for q in seqs] == [2, 5, 6]
    assert reader.state(COUNT, at=seqs[0] - 1) == 0


def test_each_event_is_folded_once(tmp_path: Path) -> None:
    calls: list[Any] = []

    def counting(state: int, data: Mapping[str, Any]) -> int:
        calls.append(data)
        return state + 1

    key = StateKey("app", "counted", 0, counting)
    with app_for(tmp_path).session() as s:
        for _ in range(5):
            s.update_state(key)
        assert len(calls) == 5  # once per update, never re-folded on read
        assert s.state(key) == 5 and s.state(key) == 5
        assert len(calls) == 5
        sid = s.id
    calls.clear()
    with app_for(tmp_path).session(None, sid) as s:
        assert s.state(key) == 5 and len(calls) == 5  # resume: each event once
        assert s.state(key) == 5 and len(calls) == 5


@pytest.mark.parametrize(("reducer", "message"), [
    (lambda s, d: 1 // 0, "the reducer raised ZeroDivisionError"),
    (lambda s, d: {1, 2}, "is a set, not JSON"),
    (lambda s, d: {"k": float("nan")}, "which JSON cannot represent"),
    (lambda s, d: {1: "x"}, "has a key of type int"),
    (lambda s, d: s.append(1), "the state is read-only: return a new value"),
])
def test_a_bad_reducer_records_nothing_and_names_plugin_and_key(
        tmp_path: Path, reducer: Any, message: str) -> None:
    key = StateKey("app", "bad", [], reducer)
    with app_for(tmp_path).session() as s:
        before = s.ledger.projection.seq
        with pytest.raises(StateError, match=message) as info:
            s.update_state(key, {"x": 1})
        assert "state app/bad" in str(info.value)
        assert s.ledger.projection.seq == before  # nothing written
        assert s.state(key) == []


def test_a_value_over_max_bytes_is_refused(tmp_path: Path) -> None:
    key = StateKey("app", "big", "", lambda s, d: s + d["t"], max_bytes=100)
    with app_for(tmp_path).session() as s:
        s.update_state(key, {"t": "x" * 50})
        with pytest.raises(StateError, match=r"the limit is 100 \(nothing was recorded\)"):
            s.update_state(key, {"t": "x" * 60})
        assert s.state(key) == "x" * 50
        assert len(s.plugin_events("app", "big")) == 1


def test_bad_update_data_and_unknown_plugin_are_refused(tmp_path: Path) -> None:
    with app_for(tmp_path).session() as s:
        with pytest.raises(PluginEventError, match="data must be a JSON object"):
            s.update_state(COUNT, [1])  # type: ignore[arg-type]
        with pytest.raises(StateError, match="no plugin 'nosuch' is registered"):
            s.update_state(StateKey("nosuch", "n", 0, add))
    with pytest.raises(StateError, match="reduce must be callable"):
        StateKey("app", "x", 0, 3)  # type: ignore[arg-type]
    with pytest.raises(StateError, match="initial value is a object"):
        StateKey("app", "x", object(), add)


def test_outside_a_run_get_and_update_say_so() -> None:
    with pytest.raises(OutsideRun):
        COUNT.get()
    with pytest.raises(OutsideRun):
        COUNT.update({})


def test_parallel_tool_calls_lose_no_update(tmp_path: Path) -> None:
    """Threads updating at once: every update counted, and the value equals a fresh fold of
    the ledger's order."""
    seen: list[int] = []
    key = StateKey("app", "log", [], lambda s, d: [*s, d["n"]])
    with app_for(tmp_path).session() as s:
        def work(base: int) -> None:
            for i in range(25):
                seen.append(base + i)
                s.update_state(key, {"n": base + i})

        threads = [threading.Thread(target=work, args=(k * 100,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        value = s.state(key)
        sid = s.id
    assert sorted(value) == sorted(seen) and len(value) == 200
    assert open_session(tmp_path / "sessions", sid).state(key) == value  # ledger order


@settings(max_examples=30, deadline=None)
@given(st.lists(st.one_of(st.integers(-5, 5).map(lambda n: ("add", n)),
                          st.just(("read", 0))), max_size=30))
def test_incremental_reads_equal_a_fold_from_scratch(tmp_path_factory: Any,
                                                     ops: list[tuple[str, int]]) -> None:
    tmp = tmp_path_factory.mktemp("fold")
    with app_for(tmp).session() as s:
        expected = 0
        for op, n in ops:
            if op == "add":
                expected += n
                assert s.update_state(COUNT, {"by": n}) == expected
            else:
                assert s.state(COUNT) == expected
        events = list(JsonlStore(tmp / "sessions").read(s.id)) if ops else []
    p = Projection()
    for e in events:
        p.apply(e)
    assert COUNT.read(p) == expected


def test_events_of_a_plugin_no_longer_installed_keep_the_session_usable(tmp_path: Path) -> None:
    key = StateKey("gone", "n", 0, add)
    app = app_for(tmp_path)
    with app.session() as s:
        key.apply(s.ledger, {"by": 4})  # as that plugin once recorded it
        s.send("hi")
        sid = s.id
    with app_for(tmp_path).session(None, sid) as s:  # loads and resumes
        assert s.send("again").outcome == "completed"
        assert len(s.plugin_events("gone")) == 1
    from dsh.ledger.state import KEYS

    del KEYS[("gone", "n")]  # this process no longer knows the key: opaque
    from dsh.ledger.reader import describe_states

    reader = open_session(tmp_path / "sessions", "latest")
    assert "gone/n" not in describe_states(reader)
    assert [e.data for e in reader.events("x/gone/n")] == [{"by": 4}]


def test_reader_resolves_latest_and_prefixes_and_names_problems(tmp_path: Path) -> None:
    app = app_for(tmp_path)
    with pytest.raises(UsageError, match="no sessions yet"):
        app.reader("latest")
    a = app.run("one").session_id
    b = app.run("two").session_id
    assert app.reader().id == b
    assert app.reader(a).id == a
    with pytest.raises(UsageError, match="no session 'zzz'"):
        app.reader("zzz")
    common = os.path.commonprefix([a, b])
    if common:
        with pytest.raises(UsageError, match="ambiguous"):
            app.reader(common)
    reader = app.reader(a)
    assert [m.content for m in reader.messages][-2:] == ["one", "one"]
    assert [e.type for e in reader.events("turn/start")] == ["turn/start"]


# -------------------------------------------------------------------- dsh.tasks, dsh.memory


def test_tasks_and_memory_are_opt_in_and_bounded(tmp_path: Path) -> None:
    from dsh.run.memory import MAX_FILE
    from dsh.run.memory import MEMORY
    from dsh.run.tasks import TASKS

    off = app_for(tmp_path).agent()
    assert not {"update_tasks", "remember", "forget"} & set(off.tools)
    big = tmp_path / "MEMORY.md"
    big.write_bytes(b"x" * (MAX_FILE + 1))
    app = app_for(tmp_path, plugins={"dsh.tasks": {"enabled": True},
                                     "dsh.memory": {"enabled": True, "file": str(big)}})
    assert {"update_tasks", "remember", "forget"} <= set(app.agent().tools)
    from dsh.run.tasks import update_tasks

    with app.session() as s:
        with pytest.warns(UserWarning, match="the limit is 32768: not used"):
            s.send("hi")
        assert "x" * 100 not in s.ledger.projection.system  # never sent whole
        assert "MEMORY.md: is 32769 bytes" in s.ledger.projection.system
        assert s.state(MEMORY)["file"]["problem"].startswith("is 32769 bytes")
        from dsh.core.errors import ToolError
        from dsh.host.runcontext import RunContext
        from dsh.host.runcontext import activate

        ctx = RunContext(run_id="t", agent="default", ledger=s.ledger, session=s)
        with activate(ctx):
            with pytest.raises(ToolError, match="at most 100 tasks .got 10000."):
                update_tasks(tasks=[{"content": "t", "status": "pending"}] * 10_000)
            assert s.state(TASKS) == []
            assert "[ ] 1. t" in update_tasks(tasks=[{"content": "t", "status": "pending"}])
            from dsh.run.memory import forget
            from dsh.run.memory import remember

            assert remember("a fact") == "Remembered as [1]."
            with pytest.raises(ToolError, match="no remembered fact has id 7"):
                forget(7)
            assert forget(1) == "Forgot [1]."
            assert s.state(MEMORY)["facts"] == []


# --------------------------------------------------------------- the outsider's plugin


def warden_env(tmp: Path, with_key: bool = False) -> tuple[Path, dict[str, str]]:
    (tmp / "slow_tool.py").write_text(textwrap.dedent('''
        import os, time
        from dsh import hookimpl

        def slow() -> str:
            """Wait."""
            open(os.environ["READY"], "w").close()
            time.sleep(60)
            return "late"

        @hookimpl
        def register_tools(register, agent):
            register(slow)
        '''))
    cfg = tmp / "dsh.toml"
    cfg.write_text(f'autoload = false\nload = ["dsh_warden", "slow_tool"]\n'
                   f'model = "openai:gpt-4o-mini"\nsessions_dir = "{tmp / "sessions"}"\n'
                   '[plugins.dsh_warden]\ndeny = ["danger"]\n')
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "DSH_LOAD_PLUGINS")}
    env.update(PYTHONPATH=os.pathsep.join([str(tmp), str(REPO / "docs" / "examples"),
                                           str(REPO)]),
               READY=str(tmp / "ready"), HOME=str(tmp), DSH_CONFIG=str(cfg))
    return cfg, env


def dsh(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsh", *args], capture_output=True, text=True,
                          env=env, timeout=120, stdin=subprocess.DEVNULL)


def test_warden_count_survives_resume_and_report_reads_a_held_session_without_a_key(
        tmp_path: Path) -> None:
    cfg, env = warden_env(tmp_path)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"tool_calls": [{"name": "danger", "arguments": {}}]}, {"text": "refused"},
        {"tool_calls": [{"name": "danger", "arguments": {}}]}, {"text": "refused again"},
        {"tool_calls": [{"name": "slow", "arguments": {}}]}, {"text": "done"}]}))
    first = dsh(env, "run", "--json", "-m", f"scripted:{script}", "try")
    assert first.returncode == 0, first.stderr
    sid = json.loads(first.stdout)["session"]
    second = dsh(env, "run", "--session", sid, "-m", f"scripted:{script}", "again")
    assert second.returncode == 0, second.stderr
    # a third turn holds the session's lock while its tool sleeps
    proc = subprocess.Popen([sys.executable, "-m", "dsh", "run", "--yes", "--session", sid,
                             "-m", f"scripted:{script}", "slowly"], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        report = dsh(env, "warden", "report", sid[:10])  # a prefix; no key in the env
        assert report.returncode == 0, report.stderr
        lines = report.stdout.splitlines()
        assert lines[0] == f"{sid}: 2 refusals"  # the count survived `dsh run --session`
        assert len(lines) == 3 and all(line.endswith(": danger") for line in lines[1:])
        latest = dsh(env, "warden", "report")
        assert latest.returncode == 0 and latest.stdout.startswith(f"{sid}: 2 refusals")
        held = dsh(env, "run", "--session", sid, "-m", "echo", "x")  # the lock is held
        assert held.returncode != 0 and "in use" in held.stderr
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()


def test_warden_report_of_an_unknown_session_is_a_clear_error(tmp_path: Path) -> None:
    _, env = warden_env(tmp_path)
    r = dsh(env, "warden", "report", "nosuch")
    assert r.returncode != 0 and r.stdout == ""
    assert "no session 'nosuch'" in r.stderr


def test_remember_in_the_project_file_reaches_the_next_turn_with_its_digest(
        dsh_make_app: Any, tmp_path: Path) -> None:
    import hashlib

    from dsh.run.memory import MEMORY

    memfile = tmp_path / "MEMORY.md"
    app = dsh_make_app({"autoload": False, "plugins": {
        "dsh.memory": {"enabled": True, "file": str(memfile)}}}, script=[
        {"tool_calls": [{"name": "remember",
                         "arguments": {"fact": "tests run with  tox", "project": True}}]},
        {"text": "noted"}, {"text": "second"}])
    first = app.run("remember it", mode="auto-edit")  # a write to a project file
    assert first.outcome == "completed", (first.reason, [e.type for e in first.events])
    outputs = [e.output for e in first.events if e.type == "tool/result"]
    assert outputs == [f"Remembered as [1] and in {memfile} (from the next turn)."]
    assert memfile.read_text() == "- tests run with tox\n"
    second = app.run("go on", session=first.session_id)
    system = app.requests[-1].system
    assert "From the project memory file" in system and "- tests run with tox" in system
    assert "- [1] tests run with  tox" in system
    recorded = app.state(MEMORY, second)["file"]
    assert recorded["sha256"] == hashlib.sha256(memfile.read_bytes()).hexdigest()
    # the file changes afterwards: the session's record, not the file, is what was sent
    memfile.write_text("- something else\n")
    reader = app.app.reader(second.session_id)
    assert "- tests run with tox" in reader.system


def test_a_parallel_child_starts_from_a_frozen_copy_of_the_parent_state(tmp_path: Path) -> None:
    from dsh.run.tasks import TASKS

    app = app_for(tmp_path, plugins={"dsh.tasks": {"enabled": True}})
    with app.session() as parent:
        parent.update_state(TASKS, {"tasks": [{"content": "shared", "status": "pending"}]})
        parent.update_state(COUNT, {"by": 3})
        [child] = app.parallel([("default", "go")], parent=parent)
        assert child.outcome == "completed", child.reason
        parent.update_state(COUNT, {"by": 1})  # after the fork: not in the child
        reader = app.reader(child.session_id)
        assert reader.state(COUNT) == 3
        assert reader.state(TASKS) == [{"content": "shared", "status": "pending"}]
        # recorded in the child's own ledger before its first turn (C3), as "$state"
        first = next(iter(reader.events("x/app/count")))
        assert first.data == {"$state": 3} and first.seq < 2
        assert "[ ] 1. shared" in reader.system
        assert parent.state(COUNT) == 4
        # the child's answer waits in the parent's inbox for its next turn; closing the
        # parent without one reports it as dropped (issue 23, B4), never silently
        with pytest.warns(InputDroppedWarning, match="context from parallel:default:"):
            parent.close()
        assert [i.source.split(":")[0] for i in parent.dropped] == ["parallel"]


def test_the_status_line_shows_task_progress() -> None:
    import io

    from dsh.cli.terminal import StatusLine
    from dsh.ledger.events import PluginEvent

    line = StatusLine(io.StringIO())
    assert "tasks" not in line.line()
    line.on_event(PluginEvent(seq=1, ts="", session="s", plugin="dsh.tasks", name="tasks",
                              data={"tasks": [{"content": "a", "status": "completed"},
                                              {"content": "b\x1b[2J", "status": "in_progress"},
                                              {"content": "c", "status": "pending"}]}))
    shown = line.line()
    assert "tasks 1/3 done, now: b\\x1b[2J" in shown and "\x1b[2J" not in shown
    line.on_event(PluginEvent(seq=2, ts="", session="s", plugin="dsh.tasks", name="tasks",
                              data={"odd": 1}))
    assert "tasks 1/3 done" in line.line()  # a line without a list changes nothing


def test_memory_is_bounded_and_says_so(tmp_path: Path) -> None:
    from dsh.run.memory import MAX_FACT
    from dsh.run.memory import MAX_FACTS
    from dsh.run.memory import MEMORY

    app = app_for(tmp_path, plugins={"dsh.memory": {"enabled": True}})
    with app.session() as s:
        for i in range(MAX_FACTS):
            s.update_state(MEMORY, {"op": "remember", "text": f"fact {i}"})
        with pytest.raises(StateError, match=f"memory is full .{MAX_FACTS} facts.: forget"):
            s.update_state(MEMORY, {"op": "remember", "text": "one too many"})
        with pytest.raises(StateError, match=f"at most {MAX_FACT} characters"):
            s.update_state(MEMORY, {"op": "forget", "id": 1}) and None  # frees one
            s.update_state(MEMORY, {"op": "remember", "text": "x" * (MAX_FACT + 1)})
        with pytest.raises(StateError, match="unknown memory operation 'wipe'"):
            s.update_state(MEMORY, {"op": "wipe"})
        facts = s.state(MEMORY)["facts"]
        assert len(facts) == MAX_FACTS - 1 and facts[0]["id"] == 2


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
_task = st.fixed_dictionaries({"content": st.text(max_size=600),
                               "status": st.sampled_from(["pending", "in_progress",
                                                          "completed", "done", ""])})


@settings(max_examples=200, deadline=None)
@given(st.one_of(_json, st.lists(st.one_of(_task, _json), max_size=6),
                 st.lists(_task, min_size=99, max_size=102)))
def test_any_task_list_is_either_refused_with_a_reason_or_kept_exactly(tasks: Any) -> None:
    from dsh.core.messages import freeze
    from dsh.run.tasks import problems
    from dsh.run.tasks import reduce

    problem = problems(tasks)
    if problem is not None:
        assert isinstance(problem, str) and problem
        with pytest.raises(ValueError, match=re.escape(problem)):
            reduce([], freeze({"tasks": tasks}))
        return
    kept = reduce([], freeze({"tasks": tasks}))
    assert [dict(t) for t in kept] == [{"content": t["content"], "status": t["status"]}
                                       for t in tasks]
    assert len(kept) <= 100
