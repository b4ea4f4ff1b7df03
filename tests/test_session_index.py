"""The session index (issue 27, item 5): a cache the ledgers can always overrule.

Real ``python -m dsh`` subprocesses list sessions over an index that was deleted, truncated,
filled with random bytes, given a wrong schema or version, a row for a deleted session, a row
of wrong types, or locked by another process: every session is still listed. A ledger copied
in by hand, or appended to, shows up; ``latest``, prefixes and ``-c`` go through the index;
writers in threads and processes leave rows equal to the ledgers' own summaries; and for any
set of file names and contents the index lists exactly what reading every ledger lists.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.ledger.events import AssistantMessage
from dsh.ledger.events import StepEnded
from dsh.ledger.events import StepStarted
from dsh.ledger.events import TurnEnded
from dsh.ledger.events import TurnStarted
from dsh.ledger.events import UserMessage
from dsh.ledger.index import PERMANENT
from dsh.ledger.index import SessionIndex
from dsh.ledger.store import JsonlStore

DSH = [sys.executable, "-m", "dsh"]
IDS = [f"20260101-0000{i:02d}.000-{i:06x}" for i in range(6)]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "dsh.toml"
    config.write_text("autoload = false\n")
    e = {k: v for k, v in os.environ.items()
         if k not in ("NO_COLOR", "DSH_LOAD_PLUGINS", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL")}
    e.update(DSH_CONFIG=str(config), DSH_HOME=str(tmp_path / "home"))
    return e


def folder(env: dict[str, str]) -> Path:
    return Path(env["DSH_HOME"]) / "sessions"


def db(env: dict[str, str]) -> Path:
    return folder(env) / ".index" / "sessions.sqlite3"


def run(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DSH, *args], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout)


def make_session(store: JsonlStore, sid: str, prompt: str = "hello", agent: str = "default",
                 parent: str | None = None, turns: int = 1) -> Path:
    with store.create(sid) as ledger:
        for turn in range(1, turns + 1):
            ledger.append(TurnStarted, turn=turn, agent=agent, model=f"echo{turn}", parent=parent)
            ledger.append(StepStarted, turn=turn, step=0)
            ledger.append(UserMessage, text=prompt if turn == 1 else f"more {turn}")
            ledger.append(AssistantMessage, text="ok")
            ledger.append(StepEnded, turn=turn, step=0)
            ledger.append(TurnEnded, turn=turn, outcome="completed")
    return store.path(sid)


def listed(env: dict[str, str], *extra: str) -> tuple[list[dict[str, Any]], list[str]]:
    limited = any(a in ("-n", "--limit") for a in extra)
    proc = run(env, "sessions", "list", "--json", *(extra if limited else (*extra, "--all")))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout), [ln for ln in proc.stderr.splitlines() if ln.strip()]


def age_folder(env: dict[str, str]) -> None:
    """Make the sessions folder's mtime old enough that the index keeps its signature."""
    old = time.time() - 60
    os.utime(folder(env), (old, old))


def index_rows(path: Path) -> dict[str, tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return {r[0]: r for r in conn.execute("SELECT id, stamp, state, agent, model, started, "
                                              "turns, first_prompt, parent FROM sessions")}
    finally:
        conn.close()


def assert_consistent(store: JsonlStore) -> None:
    """Every row the index holds is what the ledger says now, and every ledger has a row."""
    index = SessionIndex(store)
    index.refresh()
    index.close()
    rows = index_rows(index.path)
    assert set(rows) == set(store.ids())
    for sid, row in rows.items():
        info, settled = store.summary(sid)
        assert row[2] == ("ok" if settled else "open")
        assert row[3:] == (info.agent, info.model, info.started, info.turns, info.first_prompt,
                           info.parent), sid


@pytest.fixture
def six(env: dict[str, str]) -> JsonlStore:
    store = JsonlStore(folder(env))
    for i, sid in enumerate(IDS):
        make_session(store, sid, prompt=f"prompt {i}", agent="default" if i % 2 else "b")
    return store


def _random_bytes(path: Path) -> None:
    path.write_bytes(os.urandom(8192))


def _truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _wrong_schema(path: Path) -> None:
    path.unlink()
    conn = sqlite3.connect(path)
    conn.executescript("CREATE TABLE sessions (id TEXT, what TEXT); PRAGMA user_version = 1;")
    conn.close()


def _wrong_version(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()


def _wrong_types(path: Path) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE sessions SET turns = 'many', agent = 7, state = 'bogus'")
    conn.close()


def _deleted(path: Path) -> None:
    shutil.rmtree(path.parent)


def _folder_is_a_file(path: Path) -> None:
    shutil.rmtree(path.parent)
    path.parent.write_text("not a folder")


def _symlinked(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.symlink_to("/dev/null")


DAMAGE = {"deleted": _deleted, "random bytes": _random_bytes, "truncated": _truncated,
          "empty": _empty, "wrong schema": _wrong_schema, "wrong version": _wrong_version,
          "wrong types": _wrong_types, "index folder is a file": _folder_is_a_file,
          "a symlink": _symlinked}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_index_never_loses_a_session(env: dict[str, str], six: JsonlStore,
                                               damage: str) -> None:
    rows, _ = listed(env)
    assert [r["id"] for r in rows] == IDS[::-1]
    assert db(env).exists()
    for suffix in ("-wal", "-shm"):  # the damage is to the file as it is at rest
        assert not Path(f"{db(env)}{suffix}").exists()
    DAMAGE[damage](db(env))
    again, warnings = listed(env)
    assert again == rows  # every session, every field, in order
    a_only, _ = listed(env, "--agent", "default")
    assert [r["id"] for r in a_only] == [IDS[5], IDS[3], IDS[1]]
    if damage in ("index folder is a file", "a symlink"):
        # cannot be rebuilt where it is: passed over, said once per process, never fatal
        assert len(warnings) == 1 and warnings[0].startswith("dsh: warning: session index"), \
            warnings
    else:
        assert warnings == []  # rebuilt in place, silently
        assert set(index_rows(db(env))) == set(IDS)
        assert_consistent(six)


def test_a_row_for_a_deleted_session_is_dropped_and_a_stale_row_is_read_again(
        env: dict[str, str], six: JsonlStore) -> None:
    listed(env)  # makes the index folder: the sessions folder's mtime is too new to keep
    age_folder(env)
    listed(env)
    conn = sqlite3.connect(db(env))
    assert conn.execute("SELECT value FROM meta WHERE key = 'folder'").fetchone()[0]
    ghost = "20270101-000000.000-ghost0"
    with conn:  # a row for a session whose ledger is not there; the folder did not change
        conn.execute("INSERT INTO sessions VALUES (?, '1:1:1', 'ok', 'a', 'm', 's', 1, 'boo', "
                     "NULL, NULL, NULL, NULL)", (ghost,))
    conn.close()
    # a ledger appended to behind the index's back (an older dsh resuming it)
    store = JsonlStore(folder(env))
    path = store.path(IDS[0])
    data = path.read_bytes()
    more = JsonlStore(folder(env) / "scratch")
    make_session(more, IDS[0], turns=2)
    extra = more.path(IDS[0]).read_bytes().splitlines(keepends=True)[6:]
    shutil.rmtree(folder(env) / "scratch")
    age_folder(env)  # the scratch folder came and went: the folder signature moved anyway
    listed(env)
    path.write_bytes(data + b"".join(extra))
    rows, warnings = listed(env)
    assert warnings == []
    assert [r["id"] for r in rows] == IDS[::-1]  # the ghost is gone
    assert rows[-1]["turns"] == 2 and rows[-1]["model"] == "echo2"
    assert ghost not in index_rows(db(env))
    proc = run(env, "sessions", "path", "20270101")
    assert proc.returncode != 0 and "no session '20270101'" in proc.stderr


def test_a_locked_index_is_passed_over(env: dict[str, str], six: JsonlStore) -> None:
    listed(env)
    store = JsonlStore(folder(env))
    make_session(store, "20260201-000000.000-newone", prompt="made while locked")
    holder = sqlite3.connect(db(env), isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")  # another process writing, for longer than we wait
        holder.execute("DELETE FROM sessions")
        rows, warnings = listed(env)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert [r["id"] for r in rows] == ["20260201-000000.000-newone", *IDS[::-1]]
    assert len(warnings) == 1 and "locked" in warnings[0] and "listing from the ledgers" in \
        warnings[0], warnings
    rows2, warnings2 = listed(env)
    assert rows2 == rows and warnings2 == []


def test_a_hand_copied_ledger_appears_and_prefixes_latest_and_continue_use_the_index(
        env: dict[str, str], six: JsonlStore) -> None:
    listed(env)
    age_folder(env)
    listed(env)
    # copied in by hand (cp -p: its mtime is old), with an id older than all the others
    copied = folder(env) / "20251231-235959.000-copied.jsonl"
    shutil.copy2(six.path(IDS[2]), copied)
    rows, _ = listed(env)
    assert rows[-1]["id"] == "20251231-235959.000-copied" and rows[-1]["first_prompt"] == \
        "prompt 2"
    assert run(env, "sessions", "path", "20251231").stdout.strip() == str(copied)
    proc = run(env, "sessions", "path", "2026010")
    assert proc.returncode != 0 and "ambiguous" in proc.stderr and IDS[5] in proc.stderr
    assert run(env, "sessions", "path", "latest").stdout.strip() == str(six.path(IDS[5]))
    # a sub-agent's session is newest, but `latest` and -c pass it over
    make_session(six, "20260301-000000.000-child0", agent="default", parent=IDS[5])
    assert run(env, "sessions", "path", "latest").stdout.strip() == str(six.path(IDS[5]))
    proc = run(env, "run", "-m", "echo", "-c", "--any-dir", "continued")  # made with no cwd
    assert proc.returncode == 0, proc.stderr
    rows, _ = listed(env, "--agent", "default")
    assert [r["id"] for r in rows][:2] == ["20260301-000000.000-child0", IDS[5]]
    assert rows[1]["turns"] == 2
    top, _ = listed(env, "--limit", "2")
    assert [r["id"] for r in top] == ["20260301-000000.000-child0", IDS[5]]


def test_the_index_is_private_and_holds_only_what_list_shows(env: dict[str, str],
                                                             six: JsonlStore) -> None:
    listed(env)
    assert stat.S_IMODE(os.stat(db(env).parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(db(env)).st_mode) == 0o600
    conn = sqlite3.connect(db(env))
    columns = [r[1] for r in conn.execute("PRAGMA table_info(sessions)")]
    conn.close()
    assert columns == ["id", "stamp", "state", "agent", "model", "started", "turns",
                       "first_prompt", "parent", "error", "cwd", "forked_from"]


def test_writers_in_threads_and_processes_leave_a_consistent_index(env: dict[str, str],
                                                                    six: JsonlStore) -> None:
    store = JsonlStore(folder(env))
    stop = threading.Event()
    failures: list[BaseException] = []

    def lister() -> None:
        mine = JsonlStore(folder(env))  # its own connection, as another process has
        try:
            while not stop.is_set():
                got = [s.id for s in mine.sessions()]
                assert set(IDS) <= set(got)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    def maker(k: int) -> None:
        try:
            for i in range(8):
                make_session(store, f"20260401-00000{k}.{i:03d}-thread", turns=1 + i % 2)
        except BaseException as exc:  # noqa: BLE001
            failures.append(exc)

    threads = [threading.Thread(target=lister) for _ in range(4)]
    threads += [threading.Thread(target=maker, args=(k,)) for k in range(3)]
    procs = [subprocess.Popen([*DSH, "sessions", "list", "--json"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    runs = [subprocess.Popen([*DSH, "run", "-m", "echo", f"run {k}"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for k in range(2)]
    for t in threads:
        t.start()
    for t in threads[4:]:
        t.join()
    for p in procs + runs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        # a run's ledger is empty for a moment (skipped, as ever); the index never complains
        assert "Traceback" not in err and "session index" not in err, err
    stop.set()
    for t in threads[:4]:
        t.join()
    assert not failures, failures
    assert len(store.ids()) == 6 + 24 + 2
    assert_consistent(store)
    rows, warnings = listed(env)
    assert warnings == [] and [r["id"] for r in rows] == store.ids()


def _note(out: list[str], path: Path, why: str) -> None:
    out.append(why)


NAMES = st.one_of(
    st.sampled_from(IDS),
    st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=12),
    st.binary(min_size=1, max_size=12).map(os.fsdecode),
)
CONTENT = st.sampled_from(["session", "empty", "garbage", "torn", "folder", "no prompt"])


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.dictionaries(NAMES, CONTENT, max_size=6))
def test_the_index_lists_what_reading_every_ledger_lists(tmp_path_factory: Any,
                                                         entries: dict[str, str]) -> None:
    base = tmp_path_factory.mktemp("hostile")
    store = JsonlStore(base)
    for name, kind in entries.items():
        file = os.path.join(os.fsencode(base), os.fsencode(name) + b".jsonl")
        if (b"/" in os.fsencode(name) or b"\x00" in os.fsencode(name)
                or name.startswith(".")):  # not a file name; or the index's, the scratch
            continue
        try:
            if kind == "folder":
                os.mkdir(file)
                continue
            data = b""
            if kind in ("session", "torn", "no prompt"):
                scratch = JsonlStore(base / ".scratch")
                make_session(scratch, IDS[0], prompt=name)
                data = scratch.path(IDS[0]).read_bytes()
                shutil.rmtree(base / ".scratch")
                if kind == "torn":
                    data = data[:-7]
                if kind == "no prompt":
                    data = data.split(b"\n", 1)[0] + b"\n"
            elif kind == "garbage":
                data = b"\x00\xff{not json\n"
            with open(file, "wb") as f:
                f.write(data)
        except OSError:  # a name the file system refuses (too long)
            continue
    for _ in range(2):  # built, then answered from the index
        want_skips: list[str] = []
        got_skips: list[str] = []
        want = list(store._scan(partial(_note, want_skips)))
        got = list(JsonlStore(base).sessions(partial(_note, got_skips)))
        assert got == want
        assert sorted(got_skips) == sorted(want_skips)
    index = SessionIndex(store)
    rows = index_rows(index.path)
    assert all(r[1] == PERMANENT or r[0] in store.ids() for r in rows.values())


def test_threads_sharing_one_store_never_interleave_its_transactions(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import dsh.ledger.index as index_module

    index_module._warned.clear()
    store = JsonlStore(tmp_path)
    for sid in IDS:
        make_session(store, sid)
    assert [s.id for s in store.sessions()] == IDS[::-1]
    inode = os.stat(SessionIndex(store).path).st_ino
    failures: list[BaseException] = []

    def lister() -> None:
        try:
            for _ in range(15):
                got = [s.id for s in store.sessions()]  # the one shared store
                assert set(IDS) <= set(got)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    def maker() -> None:
        try:
            for i in range(10):
                make_session(JsonlStore(tmp_path), f"20260501-000000.{i:03d}-shared", turns=2)
        except BaseException as exc:  # noqa: BLE001
            failures.append(exc)

    threads = [threading.Thread(target=lister) for _ in range(4)] + [threading.Thread(
        target=maker)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert "session index" not in capsys.readouterr().err  # never passed over
    assert os.stat(SessionIndex(store).path).st_ino == inode  # never taken for damaged
    assert_consistent(store)


def _forge(env: dict[str, str], rows: list[tuple[Any, ...]]) -> None:
    conn = sqlite3.connect(db(env))
    with conn:
        conn.executemany("INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, "
                         "NULL, NULL, NULL)", rows)
    conn.close()


def test_a_forged_row_never_yields_a_path_outside_the_store(env: dict[str, str],
                                                             six: JsonlStore,
                                                             tmp_path: Path) -> None:
    """Rows naming ``../outside/victim``, ``/abs/outside/victim`` (each with the outside
    file's true stamp, so nothing looks stale) and ``evil`` (a ``*.jsonl`` symlink to the
    outside ledger): ``sessions list`` never shows them, ``show`` / ``path`` / ``rm`` never
    reach the outside file, which is still there, unchanged."""
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.jsonl"
    scratch = JsonlStore(tmp_path / "scratch")
    make_session(scratch, IDS[0], prompt="the outside secret prompt")
    victim.write_bytes(scratch.path(IDS[0]).read_bytes())
    before = (victim.read_bytes(), os.stat(victim).st_mtime_ns)
    listed(env)
    age_folder(env)
    listed(env)
    (folder(env) / "evil.jsonl").symlink_to(victim)
    age_folder(env)
    st = os.stat(victim)
    stamp = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"
    relative = os.path.relpath(outside, folder(env)) + "/victim"
    forged = [relative, str(outside / "victim"), "evil"]
    _forge(env, [(sid, stamp, "ok", "default", "m", "2027-01-01", 1, "forged row", None)
                 for sid in forged]
           + [("zz-permanent", PERMANENT, "ok", "default", "m", "s", 1, "forged", None)])
    rows, warnings = listed(env)
    assert [r["id"] for r in rows] == IDS[::-1]
    assert all(Path(r["path"]).parent == folder(env) for r in rows)
    assert "forged row" not in json.dumps(rows) and "outside secret" not in json.dumps(rows)
    assert len(warnings) == 1 and "evil.jsonl is a symbolic link" in warnings[0], warnings
    left = index_rows(db(env))
    assert relative not in left and str(outside / "victim") not in left
    assert "zz-permanent" not in left and left["evil"][2] == "error"
    for args in (("show", relative), ("show", str(outside / "victim")), ("path", relative),
                 ("rm", relative), ("rm", str(outside / "victim")), ("rm", "../"),
                 ("show", "ev"), ("rm", "ev")):
        proc = run(env, "sessions", *args)
        assert proc.returncode != 0 and "outside secret" not in proc.stdout, args
        assert (victim.read_bytes(), os.stat(victim).st_mtime_ns) == before, args
    # the symlink, named in full, is removed as a name in the folder: its target stays
    assert run(env, "sessions", "rm", "evil").returncode == 0
    assert not os.path.lexists(folder(env) / "evil.jsonl")
    assert (victim.read_bytes(), os.stat(victim).st_mtime_ns) == before
    assert [r["id"] for r in listed(env)[0]] == IDS[::-1]
