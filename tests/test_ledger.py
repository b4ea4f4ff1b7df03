"""The session ledger: append-only, locked, torn-tail recovery, permissions, fsync policy."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from dsh.core.errors import LedgerError
from dsh.core.errors import SessionInUse
from dsh.core.errors import UsageError
from dsh.core.messages import ToolCall
from dsh.ledger.events import AssistantMessage
from dsh.ledger.events import StepStarted
from dsh.ledger.events import ToolCalled
from dsh.ledger.events import TurnStarted
from dsh.ledger.events import UserMessage
from dsh.ledger.store import JsonlStore
from dsh.ledger.writer import Ledger


def _write_some(store: JsonlStore) -> str:
    with store.create() as ledger:
        ledger.append(TurnStarted, turn=1, agent="a", model="echo")
        ledger.append(StepStarted, turn=1, step=0)
        ledger.append(UserMessage, text="hello")
        return ledger.session_id


def test_new_session_file_is_owner_only(tmp_path: Path):
    store = JsonlStore(tmp_path / "s")
    sid = _write_some(store)
    mode = stat.S_IMODE(os.stat(store.path(sid)).st_mode)
    assert mode == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "s").st_mode) == 0o700


def test_second_writer_gets_session_in_use(tmp_path: Path):
    store = JsonlStore(tmp_path)
    sid = _write_some(store)
    with store.open(sid):
        with pytest.raises(SessionInUse, match=f"session {sid} is in use"):
            store.open(sid)
    with store.open(sid) as again:  # released on close
        assert again.projection.turn == 1


def test_torn_last_line_is_cut_and_reported(tmp_path: Path):
    store = JsonlStore(tmp_path)
    sid = _write_some(store)
    path = store.path(sid)
    good = path.read_bytes()
    with open(path, "ab") as f:
        f.write(b'{"v":1,"type":"assistant/mess')  # a crash mid-write
    with store.open(sid) as ledger:
        assert any("torn last line" in n for n in ledger.notes)
        # the open turn was closed on resume; nothing earlier lost
    data = path.read_bytes()
    assert data.startswith(good)
    types = [json.loads(x)["type"] for x in data.decode().splitlines()]
    assert types == ["turn/start", "step/start", "user/message", "step/end", "turn/end"]


def test_complete_but_garbled_last_line_is_a_torn_tail(tmp_path: Path):
    store = JsonlStore(tmp_path)
    sid = _write_some(store)
    with open(store.path(sid), "ab") as f:
        f.write(b"\x00\x00garbage\n")
    with store.open(sid) as ledger:
        assert ledger.notes and ledger.projection.turn == 1


def test_corrupt_middle_line_is_an_error_naming_file_and_line(tmp_path: Path):
    store = JsonlStore(tmp_path)
    sid = _write_some(store)
    path = store.path(sid)
    lines = path.read_text().splitlines()
    lines[1] = "not json"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LedgerError, match=rf"{path}:2: not JSON"):
        store.open(sid)


def test_dangling_tool_call_closed_as_interrupted(tmp_path: Path):
    store = JsonlStore(tmp_path)
    with store.create() as ledger:
        sid = ledger.session_id
        ledger.append(TurnStarted, turn=1, agent="a", model="echo")
        ledger.append(StepStarted, turn=1, step=0)
        ledger.append(UserMessage, text="go")
        call = ToolCall(id="c1", name="slow", arguments={})
        ledger.append(AssistantMessage, tool_calls=(call,))
        ledger.append(ToolCalled, call_id="c1", name="slow")
    with store.open(sid) as ledger:
        assert not ledger.projection.pending
        assert not ledger.projection.turn_open
    events = store.read(sid)
    assert [e.type for e in events][-3:] == ["tool/result", "step/end", "turn/end"]
    assert events[-3].status == "interrupted"  # type: ignore[attr-defined]
    assert events[-1].outcome == "aborted"  # type: ignore[attr-defined]


def test_unknown_session_is_a_usage_error(tmp_path: Path):
    with pytest.raises(UsageError, match="no session 'nope'"):
        JsonlStore(tmp_path).open("nope")
    with pytest.raises(UsageError, match="invalid session id"):
        JsonlStore(tmp_path).path("../etc/passwd")


@pytest.mark.parametrize("policy", ["event", "step", "never"])
def test_fsync_policies(tmp_path: Path, policy: str, monkeypatch: pytest.MonkeyPatch):
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    store = JsonlStore(tmp_path, fsync=policy)
    ledger = store.create()
    calls.clear()
    ledger.append(UserMessage, text="a")
    ledger.append(UserMessage, text="b")
    after_events = len(calls)
    ledger.step_boundary()
    after_boundary = len(calls)
    ledger.close()
    expected = {"event": (2, 3), "step": (0, 1), "never": (0, 0)}[policy]
    assert (after_events, after_boundary) == expected


def test_memory_ledger_keeps_projection_only():
    ledger = Ledger("mem")
    ledger.append(UserMessage, text="hi")
    assert [m.content for m in ledger.projection.view()] == ["hi"]
    assert ledger.path is None


def test_sessions_listing_newest_first(tmp_path: Path):
    store = JsonlStore(tmp_path)
    a = store.create("20260101-000000-aaaaaa")
    a.append(TurnStarted, turn=1, agent="x", model="echo")
    a.append(UserMessage, text="first prompt")
    a.close()
    b = store.create("20260102-000000-bbbbbb")
    b.append(TurnStarted, turn=1, agent="y", model="echo")
    b.close()
    infos = list(store.sessions())
    assert [i.id for i in infos] == ["20260102-000000-bbbbbb", "20260101-000000-aaaaaa"]
    assert infos[1].first_prompt == "first prompt" and infos[1].turns == 1
    assert store.latest("x") == "20260101-000000-aaaaaa"
    store.remove("20260101-000000-aaaaaa")
    assert store.ids() == ["20260102-000000-bbbbbb"]


def test_info_summarises_without_parsing_everything(tmp_path: Path):
    store = JsonlStore(tmp_path)
    with store.create("20260101-000000.000-aaaaaa") as ledger:
        ledger.append(TurnStarted, turn=1, agent="a", model="echo", parent="p1")
        ledger.append(UserMessage, text='first "type":"turn/start" prompt')
        ledger.append(TurnStarted, turn=2, agent="a")  # model unchanged: null
        ledger.append(TurnStarted, turn=3, agent="a", model="openai:gpt-4o")
    info = store.info("20260101-000000.000-aaaaaa")
    assert (info.agent, info.turns, info.parent) == ("a", 3, "p1")
    assert info.first_prompt == 'first "type":"turn/start" prompt'  # escaped: not counted
    assert info.model == "openai:gpt-4o"
