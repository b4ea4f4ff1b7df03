"""``dsh sessions search`` and ``sessions list -q`` (issue 37, item 4): full-text search kept in
the session index, and the listing's new columns (cost, cwd), limit and tree.

Real ``python -m dsh`` subprocesses search ledgers written by the store: each hit names its
session, turn and a snippet; the query is plain text (FTS syntax, quotes, ``*``, Unicode and
huge strings neither error nor inject); the index follows ledgers that are appended to,
rewritten, deleted or symlinked, survives being deleted, truncated or of another version
while two processes write, and falls back to reading the ledgers (one warning) when SQLite
has no FTS5 or the index is locked.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.core.messages import Usage
from dsh.ledger.events import AssistantMessage
from dsh.ledger.events import SessionForked
from dsh.ledger.events import StepEnded
from dsh.ledger.events import StepStarted
from dsh.ledger.events import ToolCalled
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import TurnEnded
from dsh.ledger.events import TurnStarted
from dsh.ledger.events import UserMessage
from dsh.ledger.search import search
from dsh.ledger.store import JsonlStore

DSH = [sys.executable, "-m", "dsh"]
NO_FTS5 = ("import sys, runpy; import dsh.ledger.index as i; i._fts5[:] = [False]; "
           "sys.argv = ['dsh', *sys.argv[1:]]; runpy.run_module('dsh', run_name='__main__')")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "dsh.toml"
    config.write_text('autoload = false\n[models.priced]\nprice = {input = 1.0, output = 2.0}\n')
    e = {k: v for k, v in os.environ.items()
         if k not in ("NO_COLOR", "DSH_LOAD_PLUGINS", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL")}
    e.update(DSH_CONFIG=str(config), DSH_HOME=str(tmp_path / "home"), HOME=str(tmp_path))
    return e


def folder(env: dict[str, str]) -> Path:
    return Path(env["DSH_HOME"]) / "sessions"


def db(env: dict[str, str]) -> Path:
    return folder(env) / ".index" / "sessions.sqlite3"


def run(env: dict[str, str], *args: str, prelude: str | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", prelude, *args] if prelude else [*DSH, *args]
    proc = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def turn(ledger: Any, n: int, prompt: str, answer: str = "ok", *, agent: str = "default",
         model: str | None = "echo", cwd: str | None = None, parent: str | None = None,
         tool: tuple[str, dict[str, Any], str] | None = None, tokens: int = 0) -> None:
    ledger.append(TurnStarted, turn=n, agent=agent, model=model, cwd=cwd, parent=parent)
    ledger.append(StepStarted, turn=n, step=0)
    ledger.append(UserMessage, text=prompt)
    if tool is not None:
        name, args, output = tool
        ledger.append(AssistantMessage, text="")
        ledger.append(ToolCalled, call_id=f"c{n}", name=name, arguments=args)
        ledger.append(ToolReturned, call_id=f"c{n}", name=name, output=output)
    ledger.append(AssistantMessage, text=answer,
                  usage=Usage(input_tokens=tokens, output_tokens=tokens // 2))
    ledger.append(StepEnded, turn=n, step=0)
    ledger.append(TurnEnded, turn=n, outcome="completed")


def make(store: JsonlStore, sid: str, *prompts: str, **kw: Any) -> Path:
    with store.create(sid) as ledger:
        for n, prompt in enumerate(prompts or ("hello",), 1):
            turn(ledger, n, prompt, **kw)
    return store.path(sid)


def sid(i: int) -> str:
    return f"20260101-{i // 3600:02d}{i // 60 % 60:02d}{i % 60:02d}.000-{i:06x}"


def hits(env: dict[str, str], *args: str, prelude: str | None = None) -> list[dict[str, Any]]:
    proc = run(env, "sessions", "search", "--json", *args, prelude=prelude)
    assert proc.returncode in (0, 1), proc.stderr
    found: list[dict[str, Any]] = json.loads(proc.stdout)
    assert proc.returncode == (0 if found else 1)
    return found


@pytest.fixture
def corpus(env: dict[str, str]) -> JsonlStore:
    store = JsonlStore(folder(env))
    make(store, sid(1), "the weather in Paris", answer="sunny")
    with store.create(sid(2)) as ledger:
        turn(ledger, 1, "first question", "plain")
        turn(ledger, 2, "read the file please", tool=("read_file", {"path": "notes/zebra.txt"},
                                                      "line one\nthe quartz marker here"))
    make(store, sid(3), "Grüße aus Köln 東京", answer="日本語 answer", agent="coder", model="priced",
         tokens=1000)
    return store


def test_search_finds_messages_tool_calls_and_results_with_turn_and_snippet(
        env: dict[str, str], corpus: JsonlStore) -> None:
    found = hits(env, "quartz marker")
    assert [(h["id"], h["turn"], h["kind"], h["name"]) for h in found] == \
        [(sid(2), 2, "result", "read_file")]
    assert "quartz marker" in found[0]["snippet"]
    assert [(h["id"], h["kind"]) for h in hits(env, "zebra")] == [(sid(2), "call")]
    assert [h["kind"] for h in hits(env, "paris")] == ["user"]
    assert [h["kind"] for h in hits(env, "SUNNY")] == ["assistant"]
    assert [h["id"] for h in hits(env, "köln")] == [sid(3)]
    assert [h["id"] for h in hits(env, "東京")] == [sid(3)]
    # every word, in one message, any order, punctuation ignored
    assert [h["id"] for h in hits(env, "marker, quartz!")] == [sid(2)]
    assert hits(env, "paris sunny") == []  # one in the question, one in the answer
    proc = run(env, "sessions", "search", "quartz")
    assert proc.returncode == 0
    assert proc.stdout.startswith(f"{sid(2)}  turn 2  result read_file: ")
    assert "the quartz marker here" in proc.stdout and proc.stdout.count("\n") == 1
    proc = run(env, "sessions", "search", "nothing-like-this")
    assert proc.returncode == 1 and proc.stdout == "" and "no matches" in proc.stderr
    proc = run(env, "sessions", "search", "*** ---")
    assert proc.returncode == 2 and "no words" in proc.stderr


@pytest.mark.parametrize(("query", "found"), [
    ("NEAR(weather paris)", False), ("weather OR nothing", False), ("weather AND", False),
    ('"weather', True), ('weather"', True), ('""', None), ("weath*", False), ("*", None),
    ("body:weather", False), ("^weather", True), ("-weather", True), ("(weather", True),
    ("weather)", True), ("weather'; DROP TABLE texts; --", False), ("\x1b[31mweather", False),
    ("the   WEATHER", True), ("weather NOT paris", False),
])
def test_fts_syntax_in_the_query_is_plain_text(env: dict[str, str], corpus: JsonlStore,
                                               query: str, found: bool | None) -> None:
    """Every word must be in the message as written: no operator, prefix, column filter or
    quote takes effect (a query of punctuation only is refused, exit 2)."""
    proc = run(env, "sessions", "search", "--json", "--", query)
    if found is None:
        assert proc.returncode == 2 and "no words" in proc.stderr
        return
    assert proc.returncode == (0 if found else 1), proc.stderr
    assert [h["id"] for h in json.loads(proc.stdout)] == ([sid(1)] if found else [])
    conn = sqlite3.connect(db(env))
    assert conn.execute("SELECT count(*) FROM texts").fetchone()[0] == 10  # nothing dropped
    conn.close()


def test_huge_and_unicode_queries_never_fail(env: dict[str, str], corpus: JsonlStore) -> None:
    big = " ".join(f"w{i}" for i in range(20000))  # 128 KB: the most one argv may hold
    assert hits(env, big[:120_000]) == []
    store = JsonlStore(folder(env))
    assert search(store, "x" * 1_000_000) == []
    assert search(store, "quartz " * 150_000)[0].session.id == sid(2)  # 1 MB, one word
    assert search(store, "\ud800 quartz \udfff")[0].kind == "result"
    assert hits(env, "Grüße") and hits(env, "grüsse") == []


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(query=st.text(min_size=0, max_size=60))
def test_any_query_gives_the_same_hits_from_the_index_and_the_ledgers(
        tmp_path_factory: Any, query: str) -> None:
    store = _property_store(tmp_path_factory)
    from dsh.ledger.search import _search_scan
    from dsh.ledger.search import words

    if not words(query):  # nothing to look for: no hits (the command refuses it, exit 2)
        assert search(store, query) == []
        return
    indexed = [(h.session.id, h.seq) for h in search(store, query)]
    scanned = [(h.session.id, h.seq) for h in _search_scan(store, words(query), None, None,
                                                            False, None)]
    assert indexed == scanned


_STORE: list[JsonlStore] = []
TEXTS = ["alpha beta", 'quote " and * star', "NEAR near OR or", "Ünïcödé 東京 ß", "a_b c-d",
         "\x1b]52;c;AAAA\x07 bell", "x" * 300, "AND NOT", "col:umn ^caret", "emoji 🙂 ok"]


def _property_store(factory: Any) -> JsonlStore:
    if not _STORE:
        store = JsonlStore(factory.mktemp("prop") / "sessions")
        for i, text in enumerate(TEXTS):
            make(store, sid(i), text, TEXTS[-1 - i])
        _STORE.append(store)
    return _STORE[0]


def test_a_snippet_never_carries_control_characters(env: dict[str, str]) -> None:
    store = JsonlStore(folder(env))
    make(store, sid(1), "look \x1b]52;c;ZXZpbA==\x07 here\x1b[2J marker\r\nnext\u202eline")
    proc = run(env, "sessions", "search", "marker")
    assert proc.returncode == 0
    assert not any(c in proc.stdout for c in "\x1b\x07\r\u202e")
    assert "\\x1b]52;c;ZXZpbA==\\x07" in proc.stdout and proc.stdout.count("\n") == 1


def test_the_index_follows_appended_rewritten_deleted_and_symlinked_ledgers(
        env: dict[str, str], tmp_path: Path) -> None:
    store = JsonlStore(folder(env))
    path = make(store, sid(1), "an original prompt")
    make(store, sid(2), "unrelated")
    assert [h["id"] for h in hits(env, "original")] == [sid(1)]
    with store.open(sid(1)) as ledger:  # resumed: only the new bytes are read
        turn(ledger, 2, "an appended prompt", "original again")
    assert [(h["turn"], h["kind"]) for h in hits(env, "original")] == \
        [(1, "user"), (2, "assistant")]
    conn = sqlite3.connect(db(env))
    docs = conn.execute("SELECT count(*) FROM docs WHERE sid = ?", (sid(1),)).fetchone()[0]
    assert docs == 4  # two turns, two messages each: nothing read twice
    conn.close()
    # rewritten in place (same inode, other text): the old text is gone
    other = JsonlStore(tmp_path / "other")
    data = make(other, sid(1), "a rewritten prompt, longer than before").read_bytes()
    with open(path, "r+b") as f:
        f.write(data)
        f.truncate()
    assert hits(env, "original") == []
    assert [h["id"] for h in hits(env, "rewritten")] == [sid(1)]
    # a *.jsonl symbolic link to a ledger outside is not a session: never read through
    outside = make(JsonlStore(tmp_path / "outside"), sid(9), "secret outside text")
    os.symlink(outside, folder(env) / f"{sid(9)}.jsonl")
    assert hits(env, "secret") == []
    path.unlink()
    assert hits(env, "rewritten") == []
    conn = sqlite3.connect(db(env))
    assert conn.execute("SELECT count(*) FROM docs WHERE sid = ?", (sid(1),)).fetchone()[0] == 0
    conn.close()


def _wrong_version(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 1")
    conn.close()


def _truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])


@pytest.mark.parametrize("damage", [Path.unlink, _truncated, _wrong_version])
def test_a_damaged_index_is_rebuilt_while_two_processes_search_and_one_writes(
        env: dict[str, str], damage: Any) -> None:
    store = JsonlStore(folder(env))
    for i in range(120):
        make(store, sid(i), f"prompt {i}", f"answer {i}", "common words here")
    assert len(hits(env, "common", "--all")) == 120
    conn = sqlite3.connect(db(env))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    damage(db(env))
    procs = [subprocess.Popen([*DSH, "sessions", "search", "--json", "--all", "common"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for i in range(120, 140):  # written meanwhile
        make(store, sid(i), f"prompt {i}", "common words here")
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and "Traceback" not in err, err
        assert len({h["id"] for h in json.loads(out)}) >= 120
    assert len(hits(env, "common", "--all")) == 140
    assert [h["id"] for h in hits(env, "prompt 137")] == [sid(137)]
    conn = sqlite3.connect(db(env))  # every ledger read once: no document twice
    assert conn.execute("SELECT count(*), count(DISTINCT sid || ':' || seq) FROM docs"
                        ).fetchone() == (120 * 6 + 20 * 4,) * 2
    conn.close()


def test_without_fts5_or_with_a_locked_index_the_ledgers_are_read(env: dict[str, str],
                                                                   corpus: JsonlStore) -> None:
    want = hits(env, "quartz")
    proc = run(env, "sessions", "search", "--json", "quartz", prelude=NO_FTS5)
    assert proc.returncode == 0 and json.loads(proc.stdout) == want
    assert proc.stderr.count("dsh: warning:") == 1 and "no FTS5" in proc.stderr
    proc = run(env, "sessions", "list", "--json", prelude=NO_FTS5)  # listing still indexed
    assert proc.returncode == 0 and proc.stderr == "" and len(json.loads(proc.stdout)) == 3
    assert [r["cost"] for r in json.loads(proc.stdout)][0] == pytest.approx(0.002)
    proc = run(env, "sessions", "list", "--json", "-q", "quartz", prelude=NO_FTS5)
    assert [r["id"] for r in json.loads(proc.stdout)] == [sid(2)]
    db(env).unlink()
    for suffix in ("-wal", "-shm"):
        Path(f"{db(env)}{suffix}").unlink(missing_ok=True)
    run(env, "sessions", "list", prelude=NO_FTS5)  # an index made without FTS5 …
    assert hits(env, "quartz") == want  # … gets it from the first Python that has it
    # locked by another writer while the index has a ledger to read: passed over
    make(corpus, sid(4), "a new quartz")
    conn = sqlite3.connect(db(env), isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    try:
        proc = run(env, "sessions", "search", "--json", "quartz")
    finally:
        conn.execute("ROLLBACK")
        conn.close()
    assert proc.returncode == 0 and [h["id"] for h in json.loads(proc.stdout)] == [sid(4), sid(2)]
    assert proc.stderr.count("dsh: warning:") == 1 and "session index not used" in proc.stderr


def test_filters_limit_and_list_query(env: dict[str, str], tmp_path: Path) -> None:
    store = JsonlStore(folder(env))
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    old = make(store, "20250101-000000.000-aaaaaa", "old marker", cwd=str(tmp_path / "else"))
    old.write_bytes(re.sub(rb'"ts":"[0-9-]{10}', b'"ts":"2025-01-01', old.read_bytes()))
    make(store, sid(1), "marker one", cwd=str(project), agent="coder")
    make(store, sid(2), "marker two", cwd=str(project / "sub"), model="priced", tokens=10)
    make(store, sid(3), "marker three", "marker again")
    assert [h["id"] for h in hits(env, "marker", "-n", "2")] == [sid(3), sid(3)]
    assert len(hits(env, "marker", "--all")) == 5
    assert [h["id"] for h in hits(env, "marker", "--agent", "coder")] == [sid(1)]
    assert [h["id"] for h in hits(env, "marker", "--model", "priced")] == [sid(2)]
    assert [h["id"] for h in hits(env, "marker", "--cwd", str(project))] == [sid(2), sid(1)]
    assert [h["id"] for h in hits(env, "marker", "--cwd", str(project / "sub"))] == [sid(2)]
    for since in ("2025-01-02", "2025-01-02T00:00", "30d", "24h", "2w"):
        assert {h["id"] for h in hits(env, "marker", "--since", since)} == \
            {sid(1), sid(2), sid(3)}, since
    assert "20250101-000000.000-aaaaaa" in {h["id"] for h in hits(env, "marker", "--since",
                                                                   "2024-12-31")}
    proc = run(env, "sessions", "search", "marker", "--since", "last tuesday")
    assert proc.returncode == 2 and "--since 'last tuesday'" in proc.stderr
    proc = run(env, "sessions", "list", "--json", "-q", "marker", "-n", "2")
    assert [r["id"] for r in json.loads(proc.stdout)] == [sid(3), sid(2)]
    proc = run(env, "sessions", "list", "--json", "--cwd", str(project), "--model", "priced")
    assert [r["id"] for r in json.loads(proc.stdout)] == [sid(2)]


def test_list_shows_twenty_cost_cwd_and_a_tree(env: dict[str, str], tmp_path: Path) -> None:
    store = JsonlStore(folder(env))
    for i in range(25):
        make(store, sid(i), f"prompt {i}", cwd=str(tmp_path / "work" / "proj"))
    make(store, sid(30), "priced one", model="priced", tokens=1000, cwd="/srv/x")
    with store.create(sid(31)) as ledger:  # a fork of 30, whose sub-agent is 32
        ledger.append(SessionForked, parent=sid(30), turn=1)
        turn(ledger, 1, "forked", model="priced", tokens=100)
    make(store, sid(32), "child work", parent=sid(31))
    proc = run(env, "sessions", "list")
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == 21
    assert lines[0].split()[:8] == ["ID", "AGENT", "MODEL", "STARTED", "TURNS", "COST", "CWD",
                                    "FIRST"]
    assert lines[1].startswith(sid(32)) and "↳ child work" in lines[1]
    row = next(ln for ln in lines if ln.startswith(sid(30)))
    assert "$0.0020" in row and "/srv/x" in row
    assert "~/work/proj" in lines[-1] and " -  " in lines[-1]  # echo has no price
    assert len(run(env, "sessions", "list", "--all").stdout.splitlines()) == 29
    assert len(run(env, "sessions", "list", "-n", "3").stdout.splitlines()) == 4
    assert run(env, "sessions", "list", "-n", "3", "--all").returncode == 2
    rows = json.loads(run(env, "sessions", "list", "--json", "-n", "3").stdout)
    assert [(r["id"], r["forked_from"], r["cwd"]) for r in rows] == [
        (sid(32), None, None), (sid(31), sid(30), None), (sid(30), None, "/srv/x")]
    assert rows[1]["cost"] == pytest.approx(0.0002) and rows[0]["cost"] is None
    body = run(env, "sessions", "list", "--tree", "-n", "2").stdout.splitlines()[1:]
    assert len(body) == 4 and body[0].startswith(sid(30)) and body[3].startswith(sid(24))
    assert body[1].startswith(f"⑂ {sid(31)}") and body[2].startswith(f"  ↳ {sid(32)}")
    tree = json.loads(run(env, "sessions", "list", "--tree", "--json", "-n", "1").stdout)
    assert [(r["id"], r["depth"]) for r in tree] == [(sid(30), 0), (sid(31), 1), (sid(32), 2)]
