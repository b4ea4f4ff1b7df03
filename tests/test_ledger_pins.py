"""Pins for the ledger's store, scan, writer and blobs modules (one module, dsh/ledger/store.py,
until issue 21) found by mutation testing (docs/testing.md): the fast load path
(that it runs, and that it gives up on everything the strict path rejects), exact error
messages, info() on realistic files, and sanitising on the way in."""

from __future__ import annotations

import errno
import json
import os
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import dsh.ledger.scan as scan_mod
import dsh.ledger.store as ledger_mod
import dsh.ledger.writer as writer_mod
from dsh.core.errors import LedgerError
from dsh.core.errors import SessionInUse
from dsh.core.errors import UsageError
from dsh.core.messages import ToolCall
from dsh.ledger.events import AssistantMessage
from dsh.ledger.events import Event
from dsh.ledger.events import StepEnded
from dsh.ledger.events import StepStarted
from dsh.ledger.events import ToolCalled
from dsh.ledger.events import TurnEnded
from dsh.ledger.events import TurnStarted
from dsh.ledger.events import UserMessage
from dsh.ledger.history import Projection
from dsh.ledger.scan import _scan_fast
from dsh.ledger.scan import parse_line
from dsh.ledger.scan import read_lines
from dsh.ledger.scan import scan
from dsh.ledger.serialize import EventCodec
from dsh.ledger.serialize import default_codec
from dsh.ledger.store import JsonlStore
from dsh.ledger.store import default_data_dir
from dsh.ledger.writer import Ledger
from dsh.ledger.writer import new_session_id
from dsh.ledger.writer import sanitized

SID = "20260101-000000.000-aaaaaa"
CODEC = default_codec()


def _session(store: JsonlStore, sid: str = SID, turns: int = 1, prompt: str = "hello",
             model: str = "echo") -> Path:
    with store.create(sid) as ledger:
        for t in range(1, turns + 1):
            ledger.append(TurnStarted, turn=t, agent="a", model=model if t == 1 else f"m{t}")
            ledger.append(StepStarted, turn=t, step=0)
            ledger.append(UserMessage, text=prompt if t == 1 else f"p{t}")
            ledger.append(AssistantMessage, text=f"answer {t}")
            ledger.append(StepEnded, turn=t, step=0)
            ledger.append(TurnEnded, turn=t, outcome="completed")
    return store.path(sid)


def _lines(n: int) -> bytes:
    out = []
    for i in range(n):
        out.append(json.dumps({"type": "user/message", "seq": i, "ts": "t", "session": "s",
                               "text": f"line {i}"}, separators=(",", ":")))
    return ("\n".join(out) + "\n").encode()


# --- the fast path: that it runs, and when it gives up ----------------------------------

def test_the_fast_path_runs_for_a_well_formed_file(tmp_path: Path):
    store = JsonlStore(tmp_path)
    path = _session(store, turns=3)
    calls = {"fresh": 0, "raw": 0}
    seen: list[Any] = []

    def fresh() -> Callable[[Any], None]:
        calls["fresh"] += 1
        return seen.append

    lines: list[str] = []

    def raw() -> Callable[[dict[str, Any], str], None]:
        calls["raw"] += 1
        return lambda d, line: (seen.append(d), lines.append(line))  # type: ignore[func-returns-value]

    good, torn = scan(path, CODEC, fresh, raw)
    assert calls == {"fresh": 0, "raw": 1}
    assert (good, torn) == (path.stat().st_size, 0)
    assert [type(d) for d in seen] == [dict] * 18 and [d["seq"] for d in seen] == list(range(18))
    # each object comes with its line's text, exactly as in the file
    assert lines == path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == seen
    # without raw, the fast path builds events
    seen.clear()
    calls.update(fresh=0, raw=0)
    assert scan(path, CODEC, fresh) == (path.stat().st_size, 0)
    assert calls["fresh"] == 1 and all(isinstance(e, Event) for e in seen) and len(seen) == 18


def test_resume_projects_from_the_raw_objects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    store = JsonlStore(tmp_path)
    _session(store, turns=2)
    used = {"raw": 0, "event": 0}
    apply_raw, apply = Projection.apply_raw, Projection.apply

    def count_raw(self: Projection, d: dict[str, Any], _key: object = None,
                  line: str | None = None) -> None:
        used["raw"] += 1
        assert line is not None and json.loads(line) == d  # the line's own text comes along
        apply_raw(self, d, _key, line)

    def count_event(self: Projection, e: Event) -> None:
        used["event"] += 1
        apply(self, e)

    monkeypatch.setattr(Projection, "apply_raw", count_raw)
    monkeypatch.setattr(Projection, "apply", count_event)
    with store.open(SID) as ledger:
        assert ledger.projection.seq == 11 and ledger.projection.turn == 2
    assert used == {"raw": 12, "event": 0}


def _fast(data: bytes, raw: bool = True) -> tuple[tuple[int, int] | None, list[Any]]:
    got: list[Any] = []

    def sink(d: Any, line: str | None = None) -> None:
        if raw:  # the text given with an object is its line, alone
            assert line is not None and "\n" not in line and json.loads(line) == d
        got.append(d)

    return _scan_fast(data, CODEC, sink, raw), got


@pytest.mark.parametrize("chunk", [1, 40, 1 << 20])
def test_the_fast_path_reads_every_line_whatever_the_chunk(chunk: int,
                                                           monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(scan_mod, "_CHUNK", chunk)
    data = _lines(7)
    result, got = _fast(data)
    assert result == (len(data), 0)
    assert [d["seq"] for d in got] == list(range(7)) and all(type(d) is dict for d in got)
    tail = b'{"type":"user/mess'
    result, got = _fast(data + tail)
    assert result == (len(data), len(tail)) and len(got) == 7
    events: list[Any] = []
    assert _scan_fast(data, CODEC, events.append) == (len(data), 0)  # raw defaults to False
    assert [e.text for e in events] == [f"line {i}" for i in range(7)]


def test_the_fast_path_of_an_empty_file():
    assert _fast(b"") == ((0, 0), [])
    assert _fast(b'{"a"') == ((0, 4), [])


def _edit(n: int, i: int, change: Callable[[dict[str, Any]], Any]) -> bytes:
    lines = _lines(n).decode().splitlines()
    d = json.loads(lines[i])
    change(d)
    lines[i] = json.dumps(d)
    return ("\n".join(lines) + "\n").encode()


GIVE_UP = {
    "blank line": _lines(2) + b"\n" + _lines(1),
    "not JSON": _lines(2) + b"{nope\n",
    "not UTF-8": _lines(1) + b'{"x": "\xff"}\n',
    "two objects on a line": _lines(2).replace(b"}\n", b"} {}\n", 1),
    "an array line": _lines(1) + b"[1]\n",
    "seq from 1": _edit(3, 0, lambda d: d.update(seq=1)).replace(b'"seq":1,', b'"seq":9,', 0),
    "seq gap": _edit(3, 2, lambda d: d.update(seq=3)),
    "seq repeated": _edit(3, 2, lambda d: d.update(seq=1)),
    "seq missing": _edit(3, 1, lambda d: d.pop("seq")),
    "seq a string": _edit(3, 1, lambda d: d.update(seq="1")),
    "seq a float": _edit(3, 1, lambda d: d.update(seq=1.0)),
    "ts missing": _edit(3, 1, lambda d: d.pop("ts")),
    "ts a number": _edit(3, 1, lambda d: d.update(ts=1)),
    "session missing": _edit(3, 1, lambda d: d.pop("session")),
    "session null": _edit(3, 1, lambda d: d.update(session=None)),
    "a surrogate escape": _edit(3, 1, lambda d: d.update(text="\ud83d\ude00")).replace(
        "😀".encode(), b"\\ud83d\\ude00"),
    "a bad field": _edit(3, 1, lambda d: d.update(text=5)),
    "an unknown event missing a field": _edit(2, 1, lambda d: d.update(type="turn/start")),
    "nested too deeply": _lines(1) + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"\n",
    "space before a value": _lines(1) + b" " + _lines(1).replace(b'"seq":0', b'"seq":1'),
    "space after a value": _lines(2).replace(b"}\n", b"} \n", 1),
    "a CRLF line end": _lines(2).replace(b"}\n", b"}\r\n", 1),
}

#: A file whose lines, joined with commas into one array, decode to one object a line with
#: consecutive seq: the first object runs on into the second line, the third line holds two.
#: Line by line it is not JSON: it must fail as such, never load as three events.
ACROSS_LINES = (
    b'{"type":"user/message","seq":0,"ts":"t","session":"s","text":"a","x":[{"b":1}\n'
    b'{"c":2}]}\n'
    b'{"type":"user/message","seq":1,"ts":"t","session":"s","text":"b"},'
    b'{"type":"user/message","seq":2,"ts":"t","session":"s","text":"c"}\n'
    + _lines(1).replace(b'"seq":0', b'"seq":3')
)


@pytest.mark.parametrize("case", sorted(GIVE_UP))
def test_the_fast_path_gives_up_on_anything_unusual(case: str):
    data = GIVE_UP[case]
    raw = case != "a bad field" and case != "an unknown event missing a field"
    assert _scan_fast(data, CODEC, lambda *a: None, raw) is None


@pytest.mark.parametrize("raw", [True, False])
def test_no_value_is_read_across_a_line_break(tmp_path: Path, raw: bool):
    assert json.loads(b"[" + b",".join(ACROSS_LINES.splitlines()) + b"]")[2]["seq"] == 2
    assert _scan_fast(ACROSS_LINES, CODEC, lambda *a: None, raw) is None
    path = tmp_path / "across.jsonl"
    path.write_bytes(ACROSS_LINES)
    with pytest.raises(LedgerError, match=r"across\.jsonl:1: not JSON"):
        read_lines(path, CODEC)


def test_a_surrogate_escape_in_the_torn_tail_does_not_stop_the_fast_path():
    data = _lines(3)
    tail = b'{"type":"user/message","text":"\\ud800'
    result, got = _fast(data + tail)
    assert result == (len(data), len(tail)) and len(got) == 3


def test_a_surrogate_pair_is_read_on_the_slow_path_and_kept(tmp_path: Path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(_edit(2, 1, lambda d: d.update(text="😀")).replace(
        "😀".encode(), b"\\ud83d\\ude00"))
    events, good, torn = read_lines(path, CODEC)
    assert [e.text for e in events] == ["line 0", "😀"]  # type: ignore[attr-defined]
    assert (good, torn) == (path.stat().st_size, 0)


# --- the slow path: torn tails and exact byte counts -----------------------------------

def test_slow_path_torn_tail_after_a_blank_line(tmp_path: Path):
    path = tmp_path / "x.jsonl"
    body = _lines(2) + b"\n" + _lines(3)[-_lines(3)[:-1].rfind(b"\n") - 1:]
    body = _lines(2) + b"\n"
    tail = b'{"type":"user/mes'
    path.write_bytes(body + tail)
    events, good, torn = read_lines(path, CODEC)
    assert (len(events), good, torn) == (2, len(body), len(tail))


def test_slow_path_garbled_last_line_is_cut_with_its_size(tmp_path: Path):
    path = tmp_path / "x.jsonl"
    body = _lines(2) + b"\n"  # a blank line sends it down the slow path
    path.write_bytes(body + b"garbage\n")
    events, good, torn = read_lines(path, CODEC)
    assert (len(events), good, torn) == (2, len(body), len(b"garbage\n"))
    path.write_bytes(body)
    assert read_lines(path, CODEC)[1:] == (len(body), 0)


def test_a_garbled_line_followed_by_a_blank_line_is_an_error(tmp_path: Path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(_lines(2) + b"garbage\n\n")
    with pytest.raises(LedgerError, match=r"x\.jsonl:3: not JSON"):
        read_lines(path, CODEC)


def test_a_ledger_over_a_mebibyte_reads_whole(tmp_path: Path):
    store = JsonlStore(tmp_path)
    big = "x" * (1 << 20) + "end"
    with store.create(SID) as ledger:
        ledger.append(TurnStarted, turn=1, agent="a")
        ledger.append(UserMessage, text=big)
        ledger.append(UserMessage, text="after")
    events = store.read(SID)
    assert [getattr(e, "text", None) for e in events] == [None, big, "after"]


# --- parse_line: what is wrong, where ---------------------------------------------------

W = "f.jsonl:7"
GOOD = {"type": "user/message", "seq": 6, "ts": "t", "session": "s", "text": "x"}


def _line(**changes: Any) -> bytes:
    d = {**GOOD, **changes}
    return json.dumps({k: v for k, v in d.items() if v is not ...}).encode()


@pytest.mark.parametrize(("line", "message"), [
    (b"{nope", "f.jsonl:7: not JSON (Expecting property name enclosed in double quotes: "
               "line 1 column 2 (char 1))"),
    (b"[" * 100_000, "f.jsonl:7: nested too deeply to read"),
    (b"[1, 2]", "f.jsonl:7: a ledger line must be a JSON object"),
    (b'"text"', "f.jsonl:7: a ledger line must be a JSON object"),
    (_line(text="\ud800"), "f.jsonl:7: holds a lone surrogate (text that is not valid Unicode; "
                           "dsh never writes one)"),
    (_line(seq=...), "f.jsonl:7: no 'seq' number"),
    (_line(seq="6"), "f.jsonl:7: no 'seq' number"),
    (_line(seq=5), "f.jsonl:7: 'seq' is 5 where 6 was expected (a line is missing, repeated "
                   "or out of order)"),
    (_line(seq=7), "f.jsonl:7: 'seq' is 7 where 6 was expected (a line is missing, repeated "
                   "or out of order)"),
    (_line(ts=...), "f.jsonl:7: no 'ts' string"),
    (_line(session=...), "f.jsonl:7: no 'session' string"),
    (_line(session=3), "f.jsonl:7: no 'session' string"),
])
def test_parse_line_says_what_is_wrong_where(line: bytes, message: str):
    with pytest.raises(LedgerError) as caught:
        parse_line(line, CODEC, W, 6)
    assert str(caught.value) == message


def test_parse_line_names_the_place_of_a_bad_field():
    with pytest.raises(LedgerError) as caught:
        parse_line(_line(text=5), CODEC, W, 6)
    assert str(caught.value).startswith("f.jsonl:7: ")


def test_parse_line_accepts_a_good_line():
    event = parse_line(_line(text="\ud83d\ude00"), CODEC, W, 6)
    assert (event.seq, event.text) == (6, "😀")  # type: ignore[attr-defined]


# --- reading files: only regular files, exact messages ----------------------------------

def test_a_missing_ledger_file(tmp_path: Path):
    with pytest.raises(UsageError) as caught:
        read_lines(tmp_path / "no.jsonl", CODEC)
    assert str(caught.value) == f"no session ledger at {tmp_path / 'no.jsonl'}"


def test_a_ledger_path_that_cannot_be_opened(tmp_path: Path):
    loop = tmp_path / "loop.jsonl"
    loop.symlink_to(loop)
    with pytest.raises(LedgerError) as caught:
        read_lines(loop, CODEC)
    assert str(caught.value) == (f"cannot read session ledger {loop}: too many levels of "
                                 "symbolic links")


def test_a_read_error_half_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = _session(JsonlStore(tmp_path))

    def failing_read(fd: int, n: int) -> bytes:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "read", failing_read)
    with pytest.raises(LedgerError) as caught:
        read_lines(path, CODEC)
    assert str(caught.value) == f"cannot read session ledger {path}: input/output error"


@pytest.mark.parametrize("kind", ["directory", "FIFO", "device"])
def test_only_regular_files_are_read(tmp_path: Path, kind: str):
    store = JsonlStore(tmp_path)
    path = store.path(SID)
    if kind == "directory":
        path.mkdir()
    elif kind == "FIFO":
        os.mkfifo(path)  # a blocking open would hang here
    else:
        path.symlink_to("/dev/null")
    for op in (lambda: read_lines(path, CODEC), lambda: store.info(SID),
               lambda: store.open(SID), lambda: store.remove(SID)):
        with pytest.raises(LedgerError) as caught:
            op()
        assert str(caught.value) == f"{path} is a {kind}, not a session ledger file"


def test_a_socket_is_not_a_ledger(tmp_path: Path):
    path = tmp_path / "s.jsonl"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        with pytest.raises(LedgerError) as caught:
            read_lines(path, CODEC)  # a socket cannot even be opened
        assert str(caught.value) == (f"cannot read session ledger {path}: no such device or "
                                     "address")
        with pytest.raises(LedgerError) as caught:
            scan_mod._check_regular(sock.fileno(), path)
        assert str(caught.value) == f"{path} is a socket, not a session ledger file"


# --- ids, paths, create, remove --------------------------------------------------------

def test_ids_of_an_empty_or_missing_directory(tmp_path: Path):
    assert JsonlStore(tmp_path / "missing").ids() == []
    (tmp_path / "empty").mkdir()
    assert JsonlStore(tmp_path / "empty").ids() == []


def test_ids_of_an_unreadable_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "d").mkdir()
    monkeypatch.setattr(os, "access", lambda p, mode: False)  # as a non-root user sees 0o000
    with pytest.raises(LedgerError) as caught:
        JsonlStore(tmp_path / "d").ids()
    assert str(caught.value) == f"cannot list sessions in {tmp_path / 'd'}: permission denied"


def test_ids_when_listing_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def failing_glob(self: Path, pattern: str) -> Any:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(Path, "glob", failing_glob)
    with pytest.raises(LedgerError) as caught:
        JsonlStore(tmp_path).ids()
    assert str(caught.value) == f"cannot list sessions in {tmp_path}: permission denied"


def test_the_session_id_guard_exactly(tmp_path: Path):
    store = JsonlStore(tmp_path)
    for bad in ("a/b", ".x", "..", "x" * 201, "é" * 101, "a\x00b", "tab\there"):
        with pytest.raises(UsageError, match="invalid session id"):
            store.path(bad)
    for good in ("x" * 200, "é" * 100, "a.b", "x.", "-x", "a b"):
        assert store.path(good) == tmp_path / f"{good}.jsonl"
    with pytest.raises(UsageError) as caught:
        store.path("y" * 80 + "/")
    assert str(caught.value) == "invalid session id " + repr("y" * 77 + "...")
    with pytest.raises(UsageError) as caught:
        store.path("/" + "y" * 79)
    assert str(caught.value) == "invalid session id " + repr("/" + "y" * 79)


def test_create_makes_missing_parents(tmp_path: Path):
    store = JsonlStore(tmp_path / "a" / "b" / "sessions")
    with store.create(SID) as ledger:
        assert ledger.path == store.path(SID)
        ledger.append(TurnStarted, turn=1, agent="a")
    assert store.ids() == [SID]


def test_create_of_an_existing_id_names_it(tmp_path: Path):
    store = JsonlStore(tmp_path)
    path = _session(store)
    before = path.read_bytes()
    with pytest.raises(UsageError) as caught:
        store.create(SID)
    assert str(caught.value) == f"session {SID} already exists ({path})"
    assert path.read_bytes() == before
    with store.open(SID) as ledger:  # still appendable, still locked by the opener only
        ledger.append(UserMessage, text="more")
    assert store.read(SID)[-1].seq == len(before.splitlines())


def test_create_refused_by_the_os(tmp_path: Path):
    (tmp_path / "file").write_text("")
    store = JsonlStore(tmp_path / "file" / "sessions")
    with pytest.raises(LedgerError) as caught:
        store.create(SID)
    assert str(caught.value).startswith(f"cannot create session ledger {store.path(SID)}: ")
    assert str(caught.value).endswith(": file exists") or "not a directory" in str(caught.value)


def test_create_while_another_process_locks_the_name(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch):
    store = JsonlStore(tmp_path)
    real_lock = ledger_mod.fcntl.flock

    def busy(fd: int, op: int) -> None:
        raise BlockingIOError(errno.EWOULDBLOCK, "busy")

    monkeypatch.setattr(ledger_mod.fcntl, "flock", busy)
    with pytest.raises(SessionInUse) as caught:
        store.create(SID)
    assert str(caught.value) == (f"session {SID} is in use by another process (lock held on "
                                 f"{store.path(SID)})")
    assert not store.path(SID).exists()  # nothing left behind
    monkeypatch.setattr(ledger_mod.fcntl, "flock", real_lock)
    with store.create(SID) as ledger:
        ledger.append(TurnStarted, turn=1, agent="a")


def test_create_refused_by_a_lock_even_when_cleaning_up_fails(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch):
    store = JsonlStore(tmp_path)

    def busy(fd: int, op: int) -> None:
        raise BlockingIOError(errno.EWOULDBLOCK, "busy")

    def failing(self: Path, missing_ok: bool = False) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(ledger_mod.fcntl, "flock", busy)
    monkeypatch.setattr(Path, "unlink", failing)
    with pytest.raises(SessionInUse):
        store.create(SID)


def test_create_when_the_directory_cannot_be_synced(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch):
    store = JsonlStore(tmp_path)
    real = os.fsync

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(LedgerError) as caught:
        store.create(SID)
    assert str(caught.value) == (f"cannot create session ledger {store.path(SID)}: "
                                 "input/output error")
    monkeypatch.setattr(os, "fsync", real)
    assert not store.path(SID).exists()


def test_the_created_file_is_append_only(tmp_path: Path):
    store = JsonlStore(tmp_path)
    ledger = store.create(SID)
    assert ledger._fd is not None
    flags = ledger_mod.fcntl.fcntl(ledger._fd, ledger_mod.fcntl.F_GETFL)
    assert flags & os.O_APPEND and flags & os.O_ACCMODE == os.O_WRONLY
    assert ledger_mod.fcntl.fcntl(ledger._fd, ledger_mod.fcntl.F_GETFD) & 1  # FD_CLOEXEC
    ledger.close()


def test_remove_messages(tmp_path: Path):
    store = JsonlStore(tmp_path)
    with pytest.raises(UsageError) as caught:
        store.remove("nope")
    assert str(caught.value) == f"no session 'nope' (looked for {store.path('nope')})"
    _session(store)
    with store.open(SID):
        with pytest.raises(SessionInUse) as busy:
            store.remove(SID)
    assert str(busy.value) == (f"session {SID} is in use by another process (lock held on "
                               f"{store.path(SID)})")
    assert store.remove(SID) == store.path(SID) and store.ids() == []


def test_remove_when_unlink_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    store = JsonlStore(tmp_path)
    path = _session(store)

    def failing(self: Path, missing_ok: bool = False) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(Path, "unlink", failing)
    with pytest.raises(LedgerError) as caught:
        store.remove(SID)
    assert str(caught.value) == f"cannot remove session ledger {path}: permission denied"


def test_remove_of_a_path_that_cannot_be_opened(tmp_path: Path):
    store = JsonlStore(tmp_path)
    store.path(SID).symlink_to(store.path(SID))
    with pytest.raises(LedgerError) as caught:
        store.remove(SID)
    assert str(caught.value) == (f"cannot remove session ledger {store.path(SID)}: too many "
                                 "levels of symbolic links")


def test_open_messages_and_flags(tmp_path: Path):
    store = JsonlStore(tmp_path)
    path = _session(store)
    with store.open(SID) as ledger:
        assert ledger.path == path and ledger.session_id == SID
        assert ledger._fd is not None
        assert ledger_mod.fcntl.fcntl(ledger._fd, ledger_mod.fcntl.F_GETFD) & 1  # FD_CLOEXEC
        flags = ledger_mod.fcntl.fcntl(ledger._fd, ledger_mod.fcntl.F_GETFL)
        assert flags & os.O_APPEND and flags & os.O_NONBLOCK
        with pytest.raises(SessionInUse) as busy:
            store.open(SID)
        assert str(busy.value) == (f"session {SID} is in use by another process (lock held "
                                   f"on {path})")
    other = tmp_path / "loop"
    store2 = JsonlStore(other)
    other.mkdir()
    store2.path(SID).symlink_to(store2.path(SID))
    with pytest.raises(LedgerError) as caught:
        store2.open(SID)
    assert str(caught.value) == (f"cannot open session ledger {store2.path(SID)} for writing: "
                                 "too many levels of symbolic links")


def test_open_of_another_users_file_says_whose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    store = JsonlStore(tmp_path)
    path = _session(store)
    os.chown(path, 4242, 4242)
    real_open = os.open

    def denied(p: Any, flags: int, *args: Any) -> int:
        if Path(p) == path:
            raise PermissionError(errno.EACCES, "Permission denied", str(p))
        return real_open(p, flags, *args)

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(LedgerError) as caught:
        store.open(SID)
    assert str(caught.value) == (
        f"cannot open session ledger {path} for writing: permission denied (the file belongs "
        "to user id 4242: was it made by `sudo dsh`?)")


def test_owner_hint(tmp_path: Path):
    mine = tmp_path / "mine"
    mine.write_text("")
    theirs = tmp_path / "theirs"
    theirs.write_text("")
    os.chown(theirs, 4242, 4242)
    denied = PermissionError(errno.EACCES, "Permission denied")
    assert ledger_mod._owner_hint(theirs, denied) == (
        " (the file belongs to user id 4242: was it made by `sudo dsh`?)")
    assert ledger_mod._owner_hint(mine, denied) == ""
    assert ledger_mod._owner_hint(theirs, OSError(errno.EIO, "x")) == ""
    assert ledger_mod._owner_hint(tmp_path / "gone", denied) == ""


def test_reason():
    assert ledger_mod._reason(OSError(errno.ENOSPC, "x")) == "no space left on device"
    assert ledger_mod._reason(OSError("short write (1 of 2 bytes)")) == (
        "short write (1 of 2 bytes)")


def test_a_short_write_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    store = JsonlStore(tmp_path)
    ledger = store.create(SID)
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, data[:3]))
    with pytest.raises(LedgerError) as caught:
        ledger.append(TurnStarted, turn=1, agent="a")
    assert re.fullmatch(rf"cannot write session ledger {re.escape(str(store.path(SID)))}: "
                        r"short write \(3 of \d+ bytes\)", str(caught.value)), str(caught.value)
    monkeypatch.undo()
    ledger.close()


def test_a_torn_tail_that_cannot_be_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    store = JsonlStore(tmp_path)
    path = _session(store)
    with open(path, "ab") as f:
        f.write(b'{"type":"turn/st')

    def failing(fd: int, size: int) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "ftruncate", failing)
    with pytest.raises(LedgerError) as caught:
        store.open(SID)
    assert str(caught.value) == f"cannot repair session ledger {path}: read-only file system"


def test_exists(tmp_path: Path):
    store = JsonlStore(tmp_path)
    assert not store.exists(SID)
    _session(store)
    assert store.exists(SID)


def test_a_store_keeps_the_codec_it_was_given(tmp_path: Path):
    codec = EventCodec()
    assert JsonlStore(tmp_path, codec=codec).codec is codec
    assert JsonlStore(tmp_path).codec is default_codec()


# --- info() on realistic files --------------------------------------------------------

def test_info_of_a_realistic_session(tmp_path: Path):
    store = JsonlStore(tmp_path)
    with store.create(SID) as ledger:
        first = ledger.append(TurnStarted, turn=1, agent="coder", model="openai:gpt-4o",
                              parent="20251231-000000.000-pppppp", system="be brief")
        ledger.append(StepStarted, turn=1, step=0)
        ledger.append(UserMessage, text="fix the bug")
        call = ToolCall(id="c1", name="read_file", arguments={"path": "a.py"})
        ledger.append(AssistantMessage, text="", tool_calls=(call,))
        ledger.append(ToolCalled, call_id="c1", name="read_file", arguments={"path": "a.py"})
        ledger.append(StepEnded, turn=1, step=0)
        ledger.append(TurnEnded, turn=1, outcome="completed")
        ledger.append(TurnStarted, turn=2, agent="coder")
        ledger.append(UserMessage, text="and now?")
        ledger.append(TurnEnded, turn=2, outcome="completed")
        ledger.append(TurnStarted, turn=3, agent="coder", model="openai:o3")
        ledger.append(UserMessage, text="last")
        ledger.append(TurnEnded, turn=3, outcome="completed")
    info = store.info(SID)
    assert info == ledger_mod.SessionInfo(
        id=SID, path=store.path(SID), agent="coder", model="openai:o3", started=first.ts,
        turns=3, first_prompt="fix the bug", parent="20251231-000000.000-pppppp")


def test_info_of_a_one_turn_session(tmp_path: Path):
    store = JsonlStore(tmp_path)
    _session(store, prompt="only")
    info = store.info(SID)
    assert (info.agent, info.model, info.turns, info.first_prompt, info.parent) == (
        "a", "echo", 1, "only", None)


def test_info_of_a_session_that_never_named_a_model(tmp_path: Path):
    store = JsonlStore(tmp_path)
    with store.create(SID) as ledger:
        ledger.append(TurnStarted, turn=1, agent="a")
        ledger.append(UserMessage, text="x")
    assert store.info(SID).model == ""


def test_info_model_is_the_last_turn_that_named_one(tmp_path: Path):
    store = JsonlStore(tmp_path)
    with store.create(SID) as ledger:
        ledger.append(TurnStarted, turn=1, agent="a", model="A")
        ledger.append(UserMessage, text="p")
        ledger.append(TurnStarted, turn=2, agent="a", model="B")
        ledger.append(TurnStarted, turn=3, agent="a")  # model unchanged: B
    assert store.info(SID).model == "B"


def test_info_counts_turns_not_lookalikes_in_arguments(tmp_path: Path):
    store = JsonlStore(tmp_path)
    with store.create(SID) as ledger:
        ledger.append(TurnStarted, turn=1, agent="a", model="A")
        ledger.append(UserMessage, text="p")
        call = ToolCall(id="1", name="f", arguments={"type": "turn/start"})
        ledger.append(AssistantMessage, tool_calls=(call,))
    assert store.info(SID).turns == 1


def test_info_with_two_turns_takes_the_second_model(tmp_path: Path):
    store = JsonlStore(tmp_path)
    _session(store, turns=2)
    assert store.info(SID).model == "m2"  # the last turn/start is followed by more lines


def test_info_when_the_last_line_is_a_turn_start_without_newline(tmp_path: Path):
    store = JsonlStore(tmp_path)
    path = _session(store, turns=1)
    with store.open(SID) as ledger:
        ledger.append(TurnStarted, turn=2, agent="a", model="late")
    data = path.read_bytes()
    path.write_bytes(data.rstrip(b"\n"))
    assert store.info(SID).model == "late"


def test_info_ignores_a_last_turn_model_that_is_not_valid_text(tmp_path: Path):
    store = JsonlStore(tmp_path)
    path = _session(store, turns=1)
    with store.open(SID) as ledger:
        ledger.append(TurnStarted, turn=2, agent="a", model="MODEL")
    path.write_bytes(path.read_bytes().replace(b'"MODEL"', b'"\\ud800"'))
    assert store.info(SID).model == "echo"


def test_info_first_turn_fields_win(tmp_path: Path):
    path = tmp_path / f"{SID}.jsonl"
    lines = [
        {"type": "turn/start", "turn": 1, "agent": "first", "parent": "p1"},
        {"type": "turn/end", "turn": 1, "outcome": "aborted"},
        {"type": "turn/start", "turn": 2, "agent": "second", "model": "m2", "parent": "p2"},
        {"type": "turn/start", "turn": 3, "agent": "third", "model": "m3", "parent": "p3"},
        {"type": "user/message", "text": "late prompt"},
    ]
    _write(path, lines)
    info = JsonlStore(tmp_path).info(SID)
    assert (info.agent, info.parent, info.first_prompt, info.turns) == (
        "first", "p1", "late prompt", 3)
    assert info.started == "2026-01-01T00:00:00.000Z"
    _write(path, lines[:3] + lines[4:])  # two turns: the model comes from the last one
    assert JsonlStore(tmp_path).info(SID).model == "m2"
    _write(path, [lines[2], lines[3]])
    assert JsonlStore(tmp_path).info(SID).model == "m3"


def _write(path: Path, lines: list[dict[str, Any]], newline: bool = True) -> None:
    out = [json.dumps({**d, "seq": i, "ts": "2026-01-01T00:00:00.000Z", "session": SID},
                      separators=(",", ":")) for i, d in enumerate(lines)]
    path.write_text("\n".join(out) + ("\n" if newline else ""))


def test_info_stops_at_a_bad_line_and_keeps_what_it_read(tmp_path: Path):
    store = JsonlStore(tmp_path)
    path = _session(store)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"garbage\n" + b"".join(lines[2:]))
    info = store.info(SID)
    assert (info.agent, info.model, info.first_prompt, info.turns) == ("a", "echo", "", 1)


def test_info_reads_only_the_first_64_lines_for_the_prompt(tmp_path: Path):
    path = tmp_path / f"{SID}.jsonl"
    head = [{"type": "turn/start", "turn": 1, "agent": "a", "model": "m"}]
    head += [{"type": "context/injected", "text": str(i)} for i in range(63)]
    _write(path, head + [{"type": "user/message", "text": "too late"}], newline=False)
    assert JsonlStore(tmp_path).info(SID).first_prompt == ""
    _write(path, head[:-1] + [{"type": "user/message", "text": "in time"}])
    assert JsonlStore(tmp_path).info(SID).first_prompt == "in time"


def test_info_of_a_long_session_reads_its_beginning(tmp_path: Path):
    store = JsonlStore(tmp_path)
    with store.create(SID) as ledger:
        ledger.append(TurnStarted, turn=1, agent="a", model="m")
        ledger.append(UserMessage, text="first")
        for i in range(100):
            ledger.append(UserMessage, text=f"more {i}")
    assert store.info(SID).first_prompt == "first"


def test_info_of_an_empty_file(tmp_path: Path):
    store = JsonlStore(tmp_path)
    store.path(SID).write_bytes(b"\n \n")
    with pytest.raises(LedgerError) as caught:
        store.info(SID)
    assert str(caught.value) == (f"{store.path(SID)} is empty (a run that ended before its "
                                 "first event)")


def test_sessions_reports_each_skipped_file_and_lists_the_rest(tmp_path: Path):
    store = JsonlStore(tmp_path)
    older = "20260101-000000.000-aaaaaa"
    newer = "20260103-000000.000-cccccc"
    _session(store, older)
    _session(store, newer)
    store.path("20260102-000000.000-bbbbbb").write_bytes(b"")
    store.path("20260102-500000.000-bbbbbb").mkdir()
    skipped: list[tuple[Path, str]] = []
    listed = [s.id for s in store.sessions(on_skip=lambda p, why: skipped.append((p, why)))]
    assert listed == [newer, older]
    empty = store.path("20260102-000000.000-bbbbbb")
    folder = store.path("20260102-500000.000-bbbbbb")
    assert skipped == [
        (folder, f"{folder} is a directory, not a session ledger file"),
        (empty, f"{empty} is empty (a run that ended before its first event)"),
    ]
    assert [s.id for s in store.sessions()] == [newer, older]
    assert store.latest() == newer and store.latest("a") == newer
    assert store.latest("nobody") is None


# --- Ledger: appending, closing, recovering --------------------------------------------

def test_every_event_is_stamped_with_seq_ts_and_session(tmp_path: Path):
    store = JsonlStore(tmp_path)
    _session(store, turns=2)
    lines = [json.loads(x) for x in store.path(SID).read_text().splitlines()]
    assert [d["seq"] for d in lines] == list(range(12))
    assert {d["session"] for d in lines} == {SID}
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", d["ts"]) for d in lines)
    assert store.path(SID).read_bytes().endswith(b"}\n")


def test_timestamps_are_utc_now(monkeypatch: pytest.MonkeyPatch):
    import time

    for now in (1_764_512_701.123, 1_764_512_701.999, 1_764_512_702.0005, 86_400.5):
        monkeypatch.setattr(time, "time", lambda now=now: now)
        stamp = writer_mod._now()
        second = int(now)
        assert stamp == (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
                         + f".{int((now - second) * 1000):03d}Z")
    monkeypatch.setattr(time, "time", lambda: 0.25)
    assert writer_mod._now() == "1970-01-01T00:00:00.250Z"
    monkeypatch.setattr(time, "time", lambda: 0.5)
    assert writer_mod._now() == "1970-01-01T00:00:00.500Z"  # the same second, reused
    monkeypatch.setattr(time, "time", lambda: 3661.75)
    assert writer_mod._now() == "1970-01-01T01:01:01.750Z"


def test_new_session_ids_sort_by_creation(monkeypatch: pytest.MonkeyPatch):
    import time

    monkeypatch.setattr(time, "time", lambda: 1_764_512_701.123)
    sid = new_session_id()
    assert re.fullmatch(r"20251130-142501\.123-[0-9a-f]{6}", sid), sid
    monkeypatch.setattr(time, "time", lambda: 86_400.999)
    assert new_session_id().startswith("19700102-000000.999-")


def test_ledger_rejects_an_unknown_fsync_policy():
    with pytest.raises(UsageError) as caught:
        Ledger("x", fsync="always")
    assert str(caught.value) == "fsync must be one of event, step, never, not 'always'"


def test_a_fresh_ledger(tmp_path: Path):
    ledger = Ledger("mem")
    assert (ledger.path, ledger.lost, ledger.notes, ledger.closed) == (None, None, [], False)
    seen: list[Event] = []
    ledger.observer = seen.append
    event = ledger.append(UserMessage, text="hi")
    assert seen == [event] and event.seq == 0 and event.session == "mem"
    path = tmp_path / "x.jsonl"
    on_disk = Ledger("x", path)
    assert on_disk.path == path and on_disk.closed
    with pytest.raises(LedgerError) as caught:
        on_disk.append(UserMessage, text="x")
    assert str(caught.value) == "session x is closed"


@pytest.mark.parametrize(("policy", "per_event", "at_boundary"),
                         [("event", 1, 1), ("step", 0, 1), ("never", 0, 0)])
def test_the_fsync_policy_holds_after_reopening(tmp_path: Path, policy: str, per_event: int,
                                                at_boundary: int,
                                                monkeypatch: pytest.MonkeyPatch):
    _session(JsonlStore(tmp_path))
    ledger = JsonlStore(tmp_path, fsync=policy).open(SID)
    assert ledger.fsync == policy
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    ledger.append(UserMessage, text="a")
    ledger.append(UserMessage, text="b")
    assert len(calls) == 2 * per_event
    ledger.step_boundary()
    assert len(calls) == 2 * per_event + at_boundary
    monkeypatch.undo()
    ledger.close()


def test_a_session_closed_before_its_first_event_leaves_no_file(tmp_path: Path):
    store = JsonlStore(tmp_path)
    store.create(SID).close()
    assert not store.path(SID).exists() and store.ids() == []
    with store.create(SID) as ledger:
        ledger.append(TurnStarted, turn=1, agent="a")
    assert store.ids() == [SID]


def test_a_ledger_opened_not_created_keeps_an_empty_file(tmp_path: Path):
    store = JsonlStore(tmp_path)
    path = store.path(SID)
    path.write_bytes(b"")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    Ledger(SID, path, fd=fd).close()
    assert path.exists()


def test_closing_after_the_first_event_keeps_the_file(tmp_path: Path):
    store = JsonlStore(tmp_path)
    ledger = store.create(SID)
    ledger.append(TurnStarted, turn=1, agent="a")
    ledger.close()
    ledger.close()  # twice is harmless
    assert store.path(SID).exists() and ledger.closed
    assert len(store.read(SID)) == 1


def test_closing_makes_the_ledger_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    store = JsonlStore(tmp_path)
    ledger = store.create(SID)
    ledger.append(TurnStarted, turn=1, agent="a")
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    ledger.close()
    assert len(calls) == 1


def test_closing_never_deletes_a_file_after_an_event_was_written(tmp_path: Path):
    store = JsonlStore(tmp_path)
    ledger = store.create(SID)
    ledger.append(TurnStarted, turn=1, agent="a")
    os.truncate(store.path(SID), 0)  # emptied by someone else
    ledger.close()
    assert store.path(SID).exists()


def test_closing_a_created_file_someone_else_wrote_to_keeps_it(tmp_path: Path):
    store = JsonlStore(tmp_path)
    ledger = store.create(SID)
    store.path(SID).write_bytes(b"not ours\n")
    ledger.close()
    assert store.path(SID).read_bytes() == b"not ours\n"


def test_closing_an_empty_created_file_when_it_is_already_gone(tmp_path: Path):
    store = JsonlStore(tmp_path)
    ledger = store.create(SID)
    store.path(SID).unlink()
    ledger.close()
    assert ledger.closed and not store.path(SID).exists()


def test_a_write_error_names_the_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    store = JsonlStore(tmp_path)
    ledger = store.create(SID)

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(LedgerError) as caught:
        ledger.append(TurnStarted, turn=1, agent="a")
    assert str(caught.value) == (f"cannot write session ledger {store.path(SID)}: no space "
                                 "left on device")
    assert ledger.projection.seq == -1  # nothing projected that was not written
    monkeypatch.undo()
    ledger.close()


def test_an_fsync_error_at_the_step_boundary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    store = JsonlStore(tmp_path)
    ledger = store.create(SID)
    ledger.append(TurnStarted, turn=1, agent="a")

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(LedgerError) as caught:
        ledger.step_boundary()
    assert str(caught.value) == f"cannot write session ledger {store.path(SID)}: input/output error"
    monkeypatch.undo()
    ledger.close()


def test_a_deleted_ledger_is_reported_once_with_its_path(tmp_path: Path):
    store = JsonlStore(tmp_path)
    ledger = store.create(SID)
    ledger.append(TurnStarted, turn=1, agent="a")
    ledger.step_boundary()
    assert ledger.lost is None
    store.path(SID).unlink()
    expected = (f"session ledger {store.path(SID)} was deleted during the run: what this run "
                "did is not saved")
    with pytest.raises(LedgerError) as caught:
        ledger.step_boundary()
    assert str(caught.value) == expected == ledger.lost
    ledger.close()
    assert ledger.closed


def test_recover_closes_everything_with_exact_records(tmp_path: Path):
    store = JsonlStore(tmp_path)
    with store.create(SID) as ledger:
        ledger.append(TurnStarted, turn=4, agent="a")
        ledger.append(StepStarted, turn=4, step=2)
        calls = (ToolCall(id="c1", name="slow", arguments={}),
                 ToolCall(id="c2", name="slower", arguments={}))
        ledger.append(AssistantMessage, tool_calls=calls)
    with store.open(SID) as ledger:
        assert ledger.notes == [
            "closed 2 dangling tool call(s) as interrupted: slow, slower",
            "closed turn 4, interrupted by the end of a process",
        ]
    events = store.read(SID)[3:]
    assert [(e.type, getattr(e, "call_id", None)) for e in events] == [
        ("tool/result", "c1"), ("tool/result", "c2"), ("step/end", None), ("turn/end", None)]
    assert events[0].output == writer_mod.INTERRUPTED
    assert events[0].status == "interrupted"  # type: ignore[attr-defined]
    assert (events[2].turn, events[2].step) == (4, 2)  # type: ignore[attr-defined]
    assert events[3].reason == (  # type: ignore[attr-defined]
        "interrupted: the process ended during this turn (closed on resume)")
    assert events[3].outcome == "aborted"  # type: ignore[attr-defined]


def test_recover_of_a_closed_session_adds_nothing(tmp_path: Path):
    store = JsonlStore(tmp_path)
    path = _session(store)
    before = path.read_bytes()
    with store.open(SID) as ledger:
        assert ledger.notes == []
    assert path.read_bytes() == before


def test_a_torn_tail_note_counts_the_events_kept(tmp_path: Path):
    store = JsonlStore(tmp_path)
    path = _session(store)
    with open(path, "ab") as f:
        f.write(b'{"type":"turn/st')
    with store.open(SID) as ledger:
        assert ledger.notes == [f"{path}: cut a torn last line (16 bytes) left by a crash; "
                                "6 earlier events kept"]


def test_a_torn_tail_note_counts_the_events_kept_on_the_slow_path(tmp_path: Path):
    """The same count when the lines are read one by one (a surrogate pair's escape sends the
    whole file there): the count is the projection's, whichever path folded the lines."""
    store = JsonlStore(tmp_path)
    with store.create() as ledger:
        sid = ledger.session_id
        ledger.append(TurnStarted, turn=1, agent="a")
        ledger.append(UserMessage, text="😀")
        ledger.append(TurnEnded, turn=1, outcome="completed")
    path = store.path(sid)
    path.write_bytes(path.read_bytes().replace("😀".encode(), b"\\ud83d\\ude00")
                     + b'{"type":"turn/st')
    assert b"\\ud83d" in path.read_bytes()
    with store.open(sid) as ledger:
        assert ledger.notes == [f"{path}: cut a torn last line (16 bytes) left by a crash; "
                                "3 earlier events kept"]
        assert ledger.projection.view()[-1].content == "😀"


# --- sanitising on the way in ----------------------------------------------------------

def test_lone_surrogates_are_replaced_and_counted(tmp_path: Path):
    store = JsonlStore(tmp_path)
    with store.create(SID) as ledger:
        ledger.append(TurnStarted, turn=1, agent="a\ud800")
        event = ledger.append(UserMessage, text="x\udc00y\ud83d\ude00", source="s\ud801")
        clean = ledger.append(UserMessage, text="fine")
    assert event.text == "x\ufffdy😀" and event.source == "s\ufffd"  # type: ignore[attr-defined]
    assert event.extra == {"sanitized": 2} and event.seq == 1 and event.session == SID
    assert clean.extra == {}
    lines = [json.loads(x) for x in store.path(SID).read_text().splitlines()]
    assert lines[0]["agent"] == "a\ufffd" and lines[0]["sanitized"] == 1
    assert lines[1]["sanitized"] == 2 and "sanitized" not in lines[2]
    assert [e.seq for e in store.read(SID)] == [0, 1, 2]


def test_sanitized_adds_to_a_previous_count_and_cleans_extra():
    event = UserMessage(seq=3, ts="t", session="s", text="a\ud800",
                        extra={"sanitized": 2, "note\ud800": "b\udc00"})
    out = sanitized(event)
    assert out.text == "a\ufffd"  # type: ignore[attr-defined]
    assert out.extra == {"sanitized": 5, "note\ufffd": "b\ufffd"}
    assert (out.seq, out.ts, out.session) == (3, "t", "s")
    assert event.extra["sanitized"] == 2  # the original is unchanged
    call = AssistantMessage(text="ok", tool_calls=(ToolCall(id="1", name="f",
                                                            arguments={"k": "\ud800"}),))
    out2 = sanitized(call)
    assert out2.tool_calls[0].arguments == {"k": "\ufffd"}  # type: ignore[attr-defined]
    assert out2.text == "ok" and out2.extra == {"sanitized": 1}  # type: ignore[attr-defined]


def _has_pair(text: str) -> bool:
    return any(0xD800 <= ord(a) <= 0xDBFF and 0xDC00 <= ord(b) <= 0xDFFF
               for a, b in zip(text, text[1:], strict=False))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0xD7F0, 0xE010).map(chr), max_size=8).map("".join)
       .filter(lambda t: not _has_pair(t)))
def test_whatever_text_comes_in_the_ledger_stays_readable(text: str):
    ledger = Ledger("mem")
    event = ledger.append(UserMessage, text=text)
    event.text.encode("utf-8")  # type: ignore[attr-defined] # never raises
    assert len(event.text) <= len(text)  # type: ignore[attr-defined]
    surrogates = any(0xD800 <= ord(c) <= 0xDFFF for c in text)
    assert set(event.extra) == ({"sanitized"} if surrogates else set())


def test_a_surrogate_pair_held_as_two_code_points_is_joined():
    event = Ledger("mem").append(UserMessage, text="a\ud83d\ude00")
    assert event.text == "a😀"  # type: ignore[attr-defined]
    assert event.extra == {}  # nothing was replaced


# --- where sessions live -----------------------------------------------------------------

def test_default_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("DSH_HOME", str(tmp_path / "dsh-home"))
    assert default_data_dir() == tmp_path / "dsh-home"
    monkeypatch.setenv("DSH_HOME", "")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_data_dir() == tmp_path / "xdg" / "dsh"
    monkeypatch.delenv("DSH_HOME")
    monkeypatch.setenv("XDG_DATA_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_data_dir() == tmp_path / "home" / ".local" / "share" / "dsh"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert default_data_dir() == tmp_path / "home" / ".local/share" / "dsh"


def test_the_session_store_hook_uses_the_config(make_app: Any, tmp_path: Path):
    app = make_app(sessions_dir=str(tmp_path / "here"), fsync="never")
    store = ledger_mod.session_store(app)
    assert (store.directory, store.fsync) == (tmp_path / "here", "never")
    app2 = make_app(sessions_dir=None)
    assert ledger_mod.session_store(app2).directory == default_data_dir() / "sessions"


def test_an_interrupt_between_the_write_and_the_projection_does_not_repeat_a_seq(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """dsh's SIGTERM/SIGHUP/Ctrl-C handler raises KeyboardInterrupt in the main thread
    wherever it is — once (seen under load) just after a plugin event's line was written and
    before the projection took it. The abort path then wrote its tool/result with the same
    ``seq``, and the session no longer loaded. The next line follows the last one written."""
    from dsh.ledger import events as ev

    store = JsonlStore(tmp_path)
    with store.create() as ledger:
        ledger.append(ev.UserMessage, text="go")

        def interrupted(self: Any, *args: Any, **kwargs: Any) -> Any:
            raise KeyboardInterrupt

        monkeypatch.setattr(Projection, "apply_raw", interrupted)
        monkeypatch.setattr(Projection, "apply", interrupted)
        with pytest.raises(KeyboardInterrupt):
            ledger.append(ev.UserMessage, text="written, not projected")
        monkeypatch.undo()
        ledger.append(ev.TurnEnded, turn=1, outcome="aborted", reason="terminated by SIGHUP")
        sid = ledger.session_id
    lines = [json.loads(x) for x in (tmp_path / f"{sid}.jsonl").read_text().splitlines()]
    assert [x["seq"] for x in lines] == [0, 1, 2]
    with store.open(sid) as again:  # and it loads
        assert again.projection.seq == 2


def test_a_signal_during_an_append_of_the_main_thread_waits_for_the_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """dsh's signal handlers call ``interrupt_or_defer``: arriving inside an append (here in
    the middle of folding the line into the projection), the KeyboardInterrupt is raised
    when the line is written *and* projected, so the next request holds what the file
    holds; outside an append it is raised at once."""
    from dsh.ledger import events as ev
    from dsh.ledger.writer import CRITICAL
    from dsh.ledger.writer import interrupt_or_defer

    with pytest.raises(KeyboardInterrupt):
        interrupt_or_defer()
    store = JsonlStore(tmp_path)
    with store.create() as ledger:
        ledger.append(ev.UserMessage, text="go")
        def signalled(real: Any) -> Any:
            def fold(self: Any, *args: Any) -> Any:
                interrupt_or_defer()  # what the handler does when the signal lands here
                return real(self, *args)
            return fold

        for name in ("apply", "apply_raw"):  # whichever folds this line
            monkeypatch.setattr(Projection, name, signalled(getattr(Projection, name)))
        with pytest.raises(KeyboardInterrupt):
            ledger.append(ev.UserMessage, text="second")
        monkeypatch.undo()
        assert [m.content for m in ledger.projection.view()] == ["go", "second"]
        assert CRITICAL.depth == 0 and not CRITICAL.pending
        ledger.append(ev.TurnEnded, turn=1, outcome="aborted", reason="interrupted")
        sid = ledger.session_id
    lines = [json.loads(x) for x in (tmp_path / f"{sid}.jsonl").read_text().splitlines()]
    assert [x["seq"] for x in lines] == [0, 1, 2]


def test_a_signal_while_an_observer_runs_is_raised_at_once(tmp_path: Path) -> None:
    """The critical section is the write and the projection only: an observer (a plugin's
    ``observe_event``, the screen) that is slow or never returns is interrupted by Ctrl-C or
    SIGTERM as before, with the line already written and projected."""
    from dsh.ledger import events as ev
    from dsh.ledger.writer import interrupt_or_defer

    store = JsonlStore(tmp_path)
    with store.create() as ledger:
        went_on: list[bool] = []

        def observer(event: Any) -> None:
            interrupt_or_defer()  # the signal lands here: it must stop the observer now
            went_on.append(True)

        ledger.observer = observer
        with pytest.raises(KeyboardInterrupt):
            ledger.append(ev.UserMessage, text="seen")
        ledger.observer = None
        assert went_on == []
        assert [m.content for m in ledger.projection.view()] == ["seen"]
        assert ledger.append(ev.UserMessage, text="next").seq == 1


def test_turn_starts_finds_a_turn_start_after_a_blank_first_line():
    """A blank line is skipped by the reader, so a turn start right after one (at offset 1)
    is the session's first: the line is searched back to the buffer's start, offset 0."""
    from dsh.ledger.scan import _turn_starts

    line = b'{"v":1,"type":"turn/start","seq":0}\n'
    assert _turn_starts(b"\n" + line) == [1]
    assert _turn_starts(line + line) == [0, len(line)]


def test_scanning_leaves_the_cyclic_collector_as_it_found_it(tmp_path: Path):
    """The read pauses the collector only while it runs: on after it if it was on, and left
    off if the caller had turned it off."""
    import gc

    store = JsonlStore(tmp_path)
    path = _session(store, turns=2)
    was = gc.isenabled()
    try:
        gc.enable()
        read_lines(path, CODEC)
        assert gc.isenabled()
        gc.disable()
        read_lines(path, CODEC)
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
