"""Plugin events ``x/PLUGIN/NAME`` (issue 11): written by a plugin inside a run or by library
code, checked hard, kept by every store, read back from the projection's index (also after a
crash and a resume in another process), passed through ``--events``, shown by ``sessions
show`` (marked when the plugin is not installed), and never model-visible unless injected as
context — which the transport holds to (C3).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.config.loader import config_from_dict
from dsh.core.errors import InvariantViolation
from dsh.core.errors import LedgerError
from dsh.core.errors import NoRunContext
from dsh.core.messages import Message
from dsh.core.messages import thaw
from dsh.hookspecs import hookimpl
from dsh.ledger import plugin_events as pe
from dsh.ledger.events import PluginEvent
from dsh.ledger.history import _LEDGER
from dsh.ledger.history import Projection
from dsh.ledger.serialize import default_codec
from dsh.ledger.serialize import dump_event
from dsh.ledger.serialize import event_to_dict
from dsh.ledger.store import JsonlStore
from dsh.ledger.writer import Ledger
from dsh.run.app import App
from dsh.run.loop import InboxItem
from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import openai_completion
from tests.servers import reconstruct
from tests.test_c3_transport import http_app

REPO = Path(__file__).resolve().parents[1]


def app_of(tmp: Path, *load: str, **extra: Any) -> App:
    cfg: dict[str, Any] = {"autoload": False, "sessions_dir": str(tmp / "sessions"),
                           "model": "echo", "load": list(load), **extra}
    return App(config_from_dict(cfg))


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


# ------------------------------------------------------------------ the API, in a run and out


def test_record_event_outside_a_run_is_a_clear_runtime_error() -> None:
    for call in (lambda: pe.record_event("app", "x"), lambda: pe.plugin_events("app")):
        with pytest.raises(RuntimeError, match="outside a run.*Session.record_event"):
            call()
        with pytest.raises(NoRunContext):
            call()


def test_a_plugin_keeps_per_session_state_across_runs(tmp_path: Path, plugin_module) -> None:
    """A counter kept in the ledger: each run reads what the previous ones wrote."""
    me: list[str] = []

    @hookimpl
    def pre_step(step) -> None:  # type: ignore[no-untyped-def]
        seen = pe.plugin_events(me[0], "prompt")
        pe.record_event(me[0], "prompt", {"n": len(seen), "text": step.text}, version=2)
        pe.record_event(me[0], "other")

    me.append(plugin_module(pre_step=pre_step))
    app = app_of(tmp_path, me[0])
    first = app.run("one")
    app.run("two", session=first.session_id)
    again = app_of(tmp_path, me[0])  # a new app: nothing in memory, all from the file
    with again.session(session_id=first.session_id) as s:
        got = s.plugin_events(me[0], "prompt")
        assert [(e.data["n"], e.data["text"], e.version) for e in got] == [
            (0, "one", 2), (1, "two", 2)]
        assert [e.name for e in s.plugin_events(me[0])] == ["prompt", "other"] * 2
        assert s.plugin_events(me[0], "missing") == ()
        # the model saw only the prompts and answers: no plugin data in the history
        assert [m.content for m in s.ledger.projection.view()] == ["one", "one", "two", "two"]
    tags = [d["type"] for d in lines(first.path) if d["type"].startswith("x/")]
    assert tags == [f"x/{me[0]}/prompt", f"x/{me[0]}/other"] * 2


def test_event_data_read_back_is_read_only(tmp_path: Path) -> None:
    app = app_of(tmp_path)
    with app.session() as s:
        ev = s.record_event("app", "state", {"items": [1, {"a": 2}]})
        with pytest.raises(TypeError):
            ev.data["items"].append(3)  # type: ignore[index]
        with pytest.raises(TypeError):
            ev.data["new"] = 1  # type: ignore[index]
        mine = thaw(ev.data)
        mine["items"].append(3)
        assert s.plugin_events("app")[0].data == {"items": [1, {"a": 2}]}


def test_only_plugins_of_the_app_may_write(tmp_path: Path, plugin_module) -> None:
    mod = plugin_module()
    app = app_of(tmp_path, mod)
    with app.session() as s:
        s.record_event(mod, "ok")
        s.record_event("app", "ok")  # the embedding application's namespace
        s.record_event("dsh.ledger", "ok")  # a built-in plugin, by its registered name
        with pytest.raises(pe.PluginEventError, match="no plugin 'nope' is registered"):
            s.record_event("nope", "x")
        assert [e.plugin for e in s.ledger.projection.plugin_index[mod]] == [mod]  # type: ignore[index]


def test_a_distribution_name_is_accepted(tmp_path: Path) -> None:
    """dsh-hooks writes as ``dsh-hooks`` (its distribution), registered as ``hooks``."""
    app = App(config_from_dict({"sessions_dir": str(tmp_path / "s"), "model": "echo"}))
    if not any(r.name == "hooks" for r in app.plugins):
        pytest.fail("dsh-hooks is not installed (.ci/run installs it)")
    assert pe.is_installed(app, "dsh-hooks") and pe.is_installed(app, "hooks")
    assert not pe.is_installed(app, "dsh-nothing")


@pytest.mark.parametrize("plugin,name", [
    ("", "x"), ("app", ""), ("a/b", "x"), ("app", "x/y"), ("-app", "x"), ("app", ".x"),
    ("app", "x" * 65), ("ap p", "x"), ("app", "é"), ("app\n", "x"), (3, "x"), ("app", None),
])
def test_names_are_checked(tmp_path: Path, plugin: Any, name: Any) -> None:
    with app_of(tmp_path).session() as s:
        with pytest.raises(pe.PluginEventError, match="invalid plugin event"):
            s.record_event(plugin, name)
        assert s.ledger.projection.seq == -1  # nothing written


BAD_DATA = [
    ([1, 2], "data must be a JSON object"),
    ({"a": {"b": math.nan}}, r"x/app/ev: data\['a'\]\['b'\] is nan"),
    ({"a": [math.inf]}, r"data\['a'\]\[0\] is inf"),
    ({"s": "ok\ud800"}, r"data\['s'\] is a string with a lone surrogate \(U\+D800"),
    ({"\udfff": 1}, r"is a key with a lone surrogate"),
    ({"n": 2**63}, r"data\['n'\] is an integer outside 64 bits"),
    ({"n": -(2**63) - 1}, "outside 64 bits"),
    ({1: "x"}, r"data\[1\] has a key of type int"),
    ({"b": b"bytes"}, r"data\['b'\] is a bytes, which is not JSON"),
    ({"s": {1, 2}}, "is a set"),
    ({"o": object()}, "is a object"),
    ({"big": "x" * (pe.MAX_DATA_BYTES + 1)}, "larger than 65536 bytes"),
    ({"deep": json.loads("[" * 40 + "]" * 40)}, "nests deeper than 32 levels"),
    ({"sk-proj-abcdefghijklmnopqrstuvwxyz0123456789": 1}, "looks like a secret"),
]


@pytest.mark.parametrize("data,message", BAD_DATA, ids=[m[:24] for _, m in BAD_DATA])
def test_bad_data_is_refused_naming_plugin_event_and_key(tmp_path: Path, data: Any,
                                                          message: str) -> None:
    with app_of(tmp_path).session() as s:
        with pytest.raises(pe.PluginEventError, match=message) as err:
            s.record_event("app", "ev", data)
        assert "x/app/ev" in str(err.value)
        assert isinstance(err.value, ValueError)
        assert s.ledger.projection.seq == -1


@pytest.mark.parametrize("version", [0, -1, 2**31, True, 1.0, "1"])
def test_bad_version_is_refused(tmp_path: Path, version: Any) -> None:
    with app_of(tmp_path).session() as s, pytest.raises(pe.PluginEventError, match="version"):
        s.record_event("app", "ev", {}, version=version)


def test_accepted_shapes_are_normalised(tmp_path: Path) -> None:
    with app_of(tmp_path).session() as s:
        ev = s.record_event("app", "ev", {"t": (1, (2, 3)), "b": True, "none": None,
                                          "f": 1.5, "i": 2**63 - 1})
        assert ev.data == {"t": [1, [2, 3]], "b": True, "none": None, "f": 1.5, "i": 2**63 - 1}
        assert s.record_event("app", "empty").data == {}


def test_secrets_in_data_are_redacted_before_the_ledger(tmp_path: Path) -> None:
    from dsh.core import redact

    secret = "registered-Secret-value-7f3a9c"
    redact.register(secret)
    app = app_of(tmp_path)
    with app.session() as s:
        ev = s.record_event("app", "leak", {"key": secret, "url": "https://u:pw@h/x",
                                           "nested": [f"Bearer {secret}"],
                                           "shape": "sk-ant-api03-abcdefghijklmnopqrstuvwx"})
        path = s.ledger.path
    text = path.read_text()  # type: ignore[union-attr]
    assert secret not in text and "pw@" not in text and "sk-ant-api03-abc" not in text
    assert ev.data["key"] == "[redacted]"


# ------------------------------------------------------------------ stores, loading, repair


def test_every_store_keeps_plugin_events(tmp_path: Path, plugin_module) -> None:
    """The JSON Lines store, the in-memory ledger (--no-save) and a store another plugin
    provides through ``session_store``."""
    me: list[str] = []

    @hookimpl
    def pre_step(step) -> None:  # type: ignore[no-untyped-def]
        pe.record_event(me[0], "seen", {"text": step.text})
        step.text = step.text + f" ({len(pe.plugin_events(me[0]))} seen)"

    class OtherStore(JsonlStore):
        """A third party's store: another directory, another file name scheme."""

        def path(self, session_id: str) -> Path:
            return self.directory / f"other-{session_id}.jsonl"

    @hookimpl
    def session_store(app) -> OtherStore:  # type: ignore[no-untyped-def]
        return OtherStore(tmp_path / "other")

    me.append(plugin_module(pre_step=pre_step))
    mem = app_of(tmp_path, me[0]).run("hi", save=False)
    assert mem.output == "hi (1 seen)" and mem.path is None, (mem.outcome, mem.reason)
    store_plugin = plugin_module(session_store=session_store)
    for app in (app_of(tmp_path, me[0]), app_of(tmp_path, me[0], store_plugin)):
        r = app.run("a")
        r = app.run("b", session=r.session_id)
        assert r.output == "b (2 seen)", (r.outcome, r.reason)
        [ev] = [e for e in app.store.read(r.session_id) if isinstance(e, PluginEvent)][-1:]
        assert ev.data == {"text": "b"}
    assert list((tmp_path / "other").glob("other-*.jsonl"))


def test_uninstalled_plugin_events_load_and_round_trip_verbatim(tmp_path: Path) -> None:
    app = app_of(tmp_path)
    with app.session() as s:
        s.record_event("app", "one", {"a": "ü\u2028", "n": [1, 2.0, None]}, version=3)
        sid, path = s.id, s.ledger.path
    assert path is not None
    # a line another dsh (or a plugin no longer installed) wrote, with a field unknown here
    foreign = {"v": 1, "type": "x/gone-plugin/state", "seq": 1, "ts": "2026-11-30T00:00:00.000Z",
               "session": sid, "plugin": "gone-plugin", "name": "state",
               "data": {"k": [True, {"x": 1.25}]}, "version": 7, "future_field": {"y": 1}}
    with path.open("a") as f:
        f.write(json.dumps(foreign, ensure_ascii=False, separators=(",", ":")) + "\n")
    before = path.read_bytes()
    events = app.store.read(sid)
    assert [e.tag for e in events] == ["x/app/one", "x/gone-plugin/state"]  # type: ignore[attr-defined]
    assert b"".join((dump_event(e) + "\n").encode() for e in events) == before
    gone = events[1]
    assert isinstance(gone, PluginEvent) and gone.version == 7
    assert gone.extra == {"future_field": {"y": 1}}
    with app.session(session_id=sid) as s:  # opening (lock, repair, project) keeps it too
        assert s.plugin_events("gone-plugin", "state")[0].data == {"k": [True, {"x": 1.25}]}
        s.record_event("app", "after")
    assert path.read_bytes().startswith(before)


@pytest.mark.parametrize("bad,why", [
    ({"type": "x/p"}, "not x/PLUGIN/NAME"),
    ({"type": "x/p/n/m"}, "not x/PLUGIN/NAME"),
    ({"type": "x/p/n", "plugin": "q"}, "disagree with the tag"),
    ({"type": "x/p/n", "data": [1]}, "'data' of 'x/p/n' is a list"),
    ({"type": "x/p/n", "version": "2"}, "'version' of 'x/p/n' is a str"),
])
def test_a_malformed_plugin_event_line_is_an_error_naming_the_line(tmp_path: Path,
                                                                    bad: dict, why: str) -> None:
    store = JsonlStore(tmp_path)
    with store.create("s1") as ledger:
        pe.record(ledger, "p", "n", {"ok": 1})
        pe.record(ledger, "p", "n", {"ok": 2})
    path = tmp_path / "s1.jsonl"
    rows = path.read_text().splitlines()
    line = {**json.loads(rows[0]), **bad}
    path.write_text(json.dumps(line) + "\n" + rows[1] + "\n")
    with pytest.raises(LedgerError, match=f"s1.jsonl:1: invalid plugin event: .*{why}"):
        store.open("s1")
    with pytest.raises(LedgerError, match=why):
        store.read("s1")


def test_a_torn_last_plugin_event_is_cut_and_the_rest_kept(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path)
    with store.create("s1") as ledger:
        for i in range(3):
            pe.record(ledger, "p", "n", {"i": i})
    path = tmp_path / "s1.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 9])  # the last line torn mid-way, no newline
    with store.open("s1") as ledger:
        assert [e.data["i"] for e in pe.read(ledger, "p")] == [0, 1]
        assert any("torn last line" in n for n in ledger.notes)
        pe.record(ledger, "p", "n", {"i": 9})
    assert [d["data"]["i"] for d in lines(path)] == [0, 1, 9]


def test_concurrent_writers_get_consecutive_seq(tmp_path: Path) -> None:
    """Plugins record from tool worker threads: every event whole, seq without gaps."""
    app = app_of(tmp_path)
    with app.session() as s:
        def many(k: int) -> None:
            for i in range(50):
                s.record_event("app", f"t{k}", {"i": i})

        threads = [threading.Thread(target=many, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        path = s.ledger.path
        assert [e.data["i"] for e in s.plugin_events("app", "t2")] == list(range(50))
    assert path is not None
    assert [d["seq"] for d in lines(path)] == list(range(200))
    with app.session(session_id=s.id) as again:
        assert len(again.plugin_events("app")) == 200


# ------------------------------------------------------------------ property: round trips


GOOD = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
        | st.floats(allow_nan=False, allow_infinity=False) | st.text())
#: What must be refused: rare, so that most generated payloads are accepted and checked.
BAD = (st.sampled_from([math.nan, -math.inf, b"x", 2**64, -(2**70), {1}])
       | st.text(min_size=1).map(lambda t: t + "\ud800"))
SCALARS = st.integers(0, 29).flatmap(lambda i: BAD if i == 0 else GOOD)
JSONISH = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


OUTCOMES = {"kept": 0, "refused": 0}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.dictionaries(st.text(max_size=8), JSONISH, max_size=5),
       version=st.integers(1, 5))
def test_generated_payloads_round_trip_exactly_or_are_refused(data: dict, version: int) -> None:
    ledger = Ledger("prop-session")  # in memory: what every store writes, line by line
    try:
        ev = pe.record(ledger, "p", "ev", data, version=version)
    except pe.PluginEventError as exc:
        assert "x/p/ev" in str(exc)
        assert ledger.projection.seq == -1
        OUTCOMES["refused"] += 1
        return
    OUTCOMES["kept"] += 1
    line = dump_event(ev)
    d = json.loads(line)
    loaded = default_codec().load(line)
    raw = Projection()
    raw.apply_raw(d)
    for back in (loaded, raw.plugin_index["p"][0]):  # type: ignore[index]
        assert isinstance(back, PluginEvent)
        assert event_to_dict(back) == event_to_dict(ev)
        assert dump_event(back) == line  # byte for byte
    assert ledger.projection.plugin_index["p", "ev"] == [ev]  # type: ignore[index]

    def plain(v: Any) -> Any:  # what JSON keeps of the input: tuples are lists
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [plain(x) for x in v]
        return v

    from dsh.core.redact import redact

    if all(redact(s) == s for s in _strings(data)):
        assert ev.data == plain(data)


def test_the_generated_payloads_were_both_kept_and_refused() -> None:
    """The property above saw both outcomes (runs after it: pytest keeps file order)."""
    if sum(OUTCOMES.values()) == 0:
        pytest.skip("the property test did not run in this session")
    assert OUTCOMES["kept"] > 50 and OUTCOMES["refused"] > 5, OUTCOMES


def _strings(v: Any) -> Iterator[str]:
    if isinstance(v, str):
        yield v
    elif isinstance(v, dict):
        for k, x in v.items():
            yield k
            yield from _strings(x)
    elif isinstance(v, list | tuple):
        for x in v:
            yield from _strings(x)


# ------------------------------------------------------------------ C3: never unrecorded


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as s:
        yield s


@pytest.fixture
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-plugin-events-key-1234")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


NOTE = {"note": "the vault code is 4711"}


@pytest.mark.usefixtures("_key")
def test_c3_a_request_wrapper_copying_plugin_event_data_is_refused(tmp_path: Path, server,
                                                                   plugin_module) -> None:
    me: list[str] = []

    @hookimpl
    def pre_step(step) -> None:  # type: ignore[no-untyped-def]
        pe.record_event(me[0], "memo", NOTE)

    @hookimpl(wrapper=True)
    def request(call):  # type: ignore[no-untyped-def]
        memo = pe.plugin_events(me[0], "memo")[-1].data
        smuggled = Message(role="user", content=json.dumps(memo))
        call.request = attrs.evolve(call.request,
                                    messages=(*call.request.messages, smuggled))
        return (yield)

    me.append(plugin_module(pre_step=pre_step, request=request))
    server.script(Reply(body=openai_completion("ok")))
    result = http_app(tmp_path, server, me[0]).run("hi")
    assert result.outcome == "error"
    assert isinstance(result.error, InvariantViolation), result.reason
    assert me[0] in result.reason  # the plugin that smuggled it is named
    assert server.bodies == []  # nothing left the process
    events = lines(result.path)
    assert [d["data"] for d in events if d["type"] == f"x/{me[0]}/memo"] == [NOTE]
    # the phrase, not a bare "4711": that turns up in a duration or an id now and then
    assert not any("vault code" in json.dumps(d) for d in events if not d["type"].startswith("x/"))


@pytest.mark.usefixtures("_key")
def test_c3_injecting_plugin_event_data_as_context_is_recorded_and_sent(
        tmp_path: Path, server, plugin_module) -> None:
    """The documented path: ``step.context`` in ``pre_step`` (and ``Session.inject`` from
    library code) writes ``context/injected`` before the request that carries it."""
    me: list[str] = []

    @hookimpl
    def pre_step(step) -> None:  # type: ignore[no-untyped-def]
        if not pe.plugin_events(me[0], "memo"):
            pe.record_event(me[0], "memo", NOTE)
        memo = pe.plugin_events(me[0], "memo")[-1].data
        step.context.append(InboxItem(memo["note"], "context", f"plugin:{me[0]}"))

    me.append(plugin_module(pre_step=pre_step))
    server.script(Reply(body=openai_completion("ok")), Reply(body=openai_completion("ok 2")))
    app = http_app(tmp_path, server, me[0])
    result = app.run("hi")
    assert result.outcome == "completed", result.reason
    with app.session(session_id=result.session_id) as s:
        ev = s.record_event("app", "memo", {"note": "library note 99"})
        s.inject(ev.data["note"], source="app")
        assert s.send("again").outcome == "completed"
    assert len(server.bodies) == 2
    assert "the vault code is 4711" in json.dumps(server.bodies[0])
    assert "library note 99" in json.dumps(server.bodies[1])
    assert server.bodies == reconstruct(result.path)  # every byte sent is in the ledger
    injected = [d for d in lines(result.path) if d["type"] == "context/injected"]
    assert [d["source"] for d in injected] == [f"plugin:{me[0]}", "app", f"plugin:{me[0]}"]


# ------------------------------------------------------------------ CLI, subprocesses

PLUGIN = '''
import os, time
from dsh.hookspecs import hookimpl
from dsh.ledger.plugin_events import plugin_events, record_event

@hookimpl
def pre_step(step):
    seen = plugin_events("pe_plugin", "step")
    record_event("pe_plugin", "step", {"n": len(seen), "text": step.text})

def slow(seconds: str) -> str:
    """Sleep a while."""
    record_event("pe_plugin", "tool", {"pid": os.getpid()})
    with open(os.environ["PE_READY"], "w") as f:
        f.write("ready")
    time.sleep(float(seconds))
    return "slept"

@hookimpl
def register_tools(register):
    register(slow)
'''


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "pe_plugin.py").write_text(textwrap.dedent(PLUGIN))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
           "PE_READY": str(tmp_path / "ready"), "HOME": str(tmp_path)}
    env.pop("DSH_LOAD_PLUGINS", None)
    return env


def config(tmp: Path, *load: str) -> Path:
    import tomli_w

    path = tmp / f"dsh-{len(load)}.toml"
    path.write_text(tomli_w.dumps({"autoload": False, "load": list(load), "model": "echo",
                                   "sessions_dir": str(tmp / "sessions")}))
    return path


def dsh(env: dict[str, str], cfg: Path, *args: str,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsh", "--config", str(cfg), *args],
                          capture_output=True, text=True, env=env, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_events_output_carries_plugin_events_byte_for_byte(tmp_path: Path,
                                                           cli_env: dict[str, str]) -> None:
    r = dsh(cli_env, config(tmp_path, "pe_plugin"), "run", "--events", "hello")
    assert r.returncode == 0, r.stderr
    out = [x for x in r.stdout.splitlines() if '"type":"x/' in x]
    [path] = (tmp_path / "sessions").glob("*.jsonl")
    ledger_lines = [x for x in path.read_text().splitlines() if '"type":"x/' in x]
    assert out == ledger_lines and len(out) == 1
    assert json.loads(out[0])["data"] == {"n": 0, "text": "hello"}


def test_sessions_show_marks_events_of_a_plugin_not_installed(tmp_path: Path,
                                                              cli_env: dict[str, str]) -> None:
    with_plugin, without = config(tmp_path, "pe_plugin"), config(tmp_path)
    r = dsh(cli_env, with_plugin, "run", "--json", "hello")
    assert r.returncode == 0, r.stderr
    sid = json.loads(r.stdout)["session"]
    shown = dsh(cli_env, with_plugin, "sessions", "show", sid)
    assert shown.returncode == 0, shown.stderr
    assert 'x/pe_plugin/step {"n":0,"text":"hello"}' in shown.stdout
    assert "not installed" not in shown.stdout
    gone = dsh(cli_env, without, "sessions", "show", sid)
    assert gone.returncode == 0, gone.stderr
    assert "x/pe_plugin/step (plugin pe_plugin not installed)" in gone.stdout
    exported = dsh(cli_env, without, "sessions", "export", sid, "--format", "jsonl")
    assert exported.returncode == 0, exported.stderr
    [path] = (tmp_path / "sessions").glob("*.jsonl")
    assert exported.stdout == path.read_text()  # verbatim, plugin installed or not
    md = dsh(cli_env, without, "sessions", "export", sid, "--format", "markdown")
    assert "**Plugin event** `x/pe_plugin/step`" in md.stdout
    # a resumed run without the plugin keeps its events and works
    again = dsh(cli_env, without, "run", "--session", sid, "more")
    assert again.returncode == 0, again.stderr
    assert path.read_text().count('"type":"x/pe_plugin/step"') == 1


def test_plugin_events_survive_sigkill_and_resume(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """A run killed mid-tool: the session loads (torn tail cut, dangling call closed),
    resumes, and ``plugin_events`` returns everything written before the kill."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"tool_calls": [{"name": "slow", "arguments": {"seconds": "60"}}]}, {"text": "done"}]}))
    cfg = config(tmp_path, "pe_plugin")
    proc = subprocess.Popen([sys.executable, "-m", "dsh", "--config", str(cfg), "run", "--yes",
                             "-m", f"scripted:{script}", "go"], env=cli_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the tool never started"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    [path] = (tmp_path / "sessions").glob("*.jsonl")
    written = lines(path)
    assert written[-1]["type"] == "x/pe_plugin/tool"  # the last thing before the kill
    with path.open("ab") as f:
        f.write(b'{"v":1,"type":"x/pe_plugin/step","seq":')  # a torn write at the kill
    sys.path.insert(0, str(tmp_path))
    try:
        app = App.from_config(str(cfg))
        sid = path.stem
        with app.session(session_id=sid) as s:
            assert any("torn last line" in n for n in s.ledger.notes)
            assert any("dangling tool call" in n for n in s.ledger.notes)
            assert [e.data["text"] for e in s.plugin_events("pe_plugin", "step")] == ["go"]
            [tool] = s.plugin_events("pe_plugin", "tool")
            assert tool.data["pid"] == proc.pid
            result = s.send("after the crash")
            assert result.outcome == "completed", result.reason
            steps = s.plugin_events("pe_plugin", "step")
            assert [(e.data["n"], e.data["text"]) for e in steps] == [
                (0, "go"), (1, "after the crash")]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("pe_plugin", None)
    assert [d["seq"] for d in lines(path)] == list(range(len(lines(path))))


# ------------------------------------------------------------------ the docs' example


def test_the_docs_example_plugin_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/plugin-state.md, "Your plugin's own events": its code, loaded as the plugin ``memo``."""
    import re
    import types

    text = (REPO / "docs" / "plugin-state.md").read_text()
    section = text.split("### Your plugin's own events")[1].split("\n### ")[0]
    [code] = re.findall(r"```python\n(.*?)```", section, re.S)
    mod = types.ModuleType("memo")
    exec(compile(code, "docs/plugin-state.md", "exec"), mod.__dict__)  # noqa: S102 - the docs' code
    monkeypatch.setitem(sys.modules, "memo", mod)
    app = app_of(tmp_path, "memo")
    first = app.run("hi")
    app.run("again", session=first.session_id)
    with app_of(tmp_path, "memo").session(session_id=first.session_id) as s:
        assert [e.data for e in s.plugin_events("memo", "note")] == [
            {"prompt": "hi", "seen": 0}, {"prompt": "again", "seen": 1}]


def test_a_plugin_loaded_by_module_is_known_by_its_distribution(tmp_path: Path) -> None:
    """``load = ["dsh_hooks"]`` registers the plugin as ``dsh_hooks``: its events written as
    ``x/dsh-hooks/…`` still belong to an installed plugin (the module's distribution)."""
    app = app_of(tmp_path, "dsh_hooks")
    assert pe.is_installed(app, "dsh_hooks") and pe.is_installed(app, "dsh-hooks")
    assert not pe.is_installed(app, "dsh-shell")  # installed, but not loaded by this app
    with app.session() as s:
        assert s.record_event("dsh-hooks", "note").tag == "x/dsh-hooks/note"


SHAPES = st.sampled_from([
    "sk-" + "a1B2" * 6, "Bearer abcdef1234567890", "token=ghp_" + "x1" * 16,
    "https://user:pw@example.com/x", "https://h/x?api_key=s3cr3t&b=1", "AKIA" + "A1B2" * 4,
    "-----BEGIN RSA PRIVATE KEY-----\nMIIB", "Authorization: Basic dXNlcjpwYXNz", "sk-ab…",
    "registered-Prop-secret-42", "xoxb-1234567890-abc", "hf_" + "a" * 30, "plain words",
])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=6), SHAPES, st.text(max_size=6)), max_size=6))
def test_redaction_is_the_same_as_string_by_string(parts: list[tuple[str, str, str]]) -> None:
    """One redact() over all strings decides whether any needs it: never a miss."""
    from dsh.core import redact

    redact.register("registered-Prop-secret-42")
    data = {f"k{i}": "".join(p) for i, p in enumerate(parts)
            if not any(0xD800 <= ord(c) <= 0xDFFF for c in "".join(p))}
    assert pe.clean_data("p", "n", data) == {k: redact.redact(v) for k, v in data.items()}


def test_a_hostile_plugin_event_line_cannot_drive_the_terminal(tmp_path: Path) -> None:
    """Names and data of a hand-written line are shown with their controls made visible."""
    from dsh.cli.render import trajectory

    store = JsonlStore(tmp_path)
    with store.create("s1") as ledger:
        pe.record(ledger, "p", "n", {"ok": 1})
    line = {"v": 1, "type": "x/p\x1b]52;c;Zm9v\x07/n", "seq": 1, "ts": "t", "session": "s1",
            "data": {"t": "\x1b[2J\u202egnp.exe\x9b31m"}}
    with (tmp_path / "s1.jsonl").open("a") as f:
        f.write(json.dumps(line) + "\n")
    events = store.read("s1")
    shown = trajectory(events, terminal=True, installed=lambda p: p == "p")
    assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown
    assert "\x9b" not in shown
    assert "\\x1b]52" in shown and "not installed" in shown
    piped = trajectory(events, terminal=False)
    assert "\x1b]52" in piped  # to a pipe or a file: byte for byte


def test_reading_is_an_o1_snapshot_view(tmp_path: Path) -> None:
    """``plugin_events`` copies nothing: a view is the index's own list and a count (so
    reading the latest event costs the same after 10 events as after 20,000), and a view
    taken earlier does not see later events. Checked by identity, not by timing."""
    ledger = Ledger("view")
    for i in range(10):
        pe.record(ledger, "p", "n", {"i": i})
    early = pe.read(ledger, "p", "n")
    index = ledger.projection.plugin_index
    assert index is not None
    assert early._items is index[("p", "n")]  # the list itself, not a copy
    for i in range(10, 20_000):  # (as the ledger does: faster than writing 20k events)
        ledger.projection.index_plugin_event(PluginEvent(plugin="p", name="n", data={"i": i}),
                                             _LEDGER)
    assert pe.read(ledger, "p", "n")._items is index[("p", "n")]
    assert len(early) == 10 and early[-1].data == {"i": 9} and list(early)[0].data == {"i": 0}
    assert early[2:4] == (early[2], early[3])
    view = pe.read(ledger, "p", "n")
    assert len(view) == 20_000 and view[-1].data == {"i": 19_999}
    with pytest.raises(IndexError):
        early[10]
    with pytest.raises(TypeError):
        hash(view)
