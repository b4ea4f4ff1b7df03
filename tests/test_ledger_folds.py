"""The projection's fast folds (dsh.ledger.folds) accept, refuse and fold exactly what the
generic path (``check_raw`` and ``Projection.apply_raw``'s own branches) does."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dsh.core.errors import LedgerError
from dsh.ledger import history
from dsh.ledger.folds import FOLDS
from dsh.ledger.history import Projection
from dsh.ledger.parts import InvalidLine

_BASE = {"v": 1, "seq": 0, "ts": "2026-12-04T12:00:00.000Z", "session": "s"}

#: Valid lines of every folded tag, with and without their optional fields.
LINES: list[dict[str, Any]] = [
    {"type": "step/start", "turn": 1, "step": 0},
    {"type": "step/end", "turn": 1, "step": 0},
    {"type": "turn/end", "turn": 1, "outcome": "completed"},
    {"type": "turn/end", "turn": 1, "outcome": "error", "reason": "boom"},
    {"type": "tool/call", "call_id": "c1", "name": "read"},
    {"type": "tool/call", "call_id": "c1", "name": "read", "arguments": {"p": [1, {"q": 2}]},
     "child_session": None},
    {"type": "tool/call", "call_id": "c1", "name": "read", "arguments": {}, "child_session": "x"},
    {"type": "assistant/message"},
    {"type": "assistant/message", "text": "hi", "usage": {"input_tokens": 3, "output_tokens": 2}},
    {"type": "assistant/message", "text": "", "usage": {}, "model": None, "stop_reason": "x",
     "tool_call_source": "native",
     "tool_calls": [{"id": "c1", "name": "read", "arguments": {"p": "a"}}, {"id": "c2",
                                                                            "name": "w"}]},
    {"type": "assistant/message", "text": "t", "reasoning": [
        {"kind": "thinking", "provider": "anthropic", "text": "hm", "signature": "s"}],
     "usage": {"input_tokens": 0, "output_tokens": 5, "cache_read_tokens": 1,
               "cache_write_tokens": 0}},
    {"type": "tool/result", "call_id": "c1", "name": "read"},
    {"type": "tool/result", "call_id": "c1", "name": "read", "status": "error", "output": "no",
     "duration_ms": 1.5},
    {"type": "tool/result", "call_id": "c2", "name": "w", "status": "ok", "output": "",
     "duration_ms": 2, "changes": [{"path": "a.txt", "op": "update", "diff": "-a\n+b\n"}]},
    {"type": "tool/result", "call_id": "c2", "name": "w", "duration_ms": None, "changes": []},
    {"type": "user/message", "text": "hello"},
    {"type": "user/message", "text": "hello", "source": "plugin:x", "attachments": []},
    {"type": "user/message", "text": "see", "attachments": [
        {"name": "a.png", "media_type": "image/png", "sha256": "0" * 64, "size": 3}]},
]

WRONG = [None, True, 0, 1.5, "s", [], {}, [1], {"a": 1}]


def _state(p: Projection) -> tuple[Any, ...]:
    return (list(p._messages), dict(p.pending), p.seq, p.step, p.step_open, p.turn_open,
            p.answers, p.last_usage)


def _fold(d: dict[str, Any], fast: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    p = Projection()
    # an answer with two calls first, so results and calls have something to close
    p.apply_raw({**_BASE, "seq": 0, "type": "assistant/message", "tool_calls": [
        {"id": "c1", "name": "read"}, {"id": "c2", "name": "w"}]})
    with monkeypatch.context() as m:
        if not fast:
            m.setattr(history, "FOLDS", {})
        try:
            p.apply_raw(copy.deepcopy(d))
        except (InvalidLine, KeyError, LedgerError, TypeError):
            return "refused", _state(p)
    return "folded", _state(p)


def _variants(line: dict[str, Any]) -> list[dict[str, Any]]:
    out = [line]
    full = {**_BASE, "seq": 1, **line}
    for key in full:
        if key == "type":
            continue
        out.append({k: v for k, v in full.items() if k != key})  # the field missing
        out.extend({**full, key: w} for w in WRONG)  # the field of every other JSON shape
    return out


@pytest.mark.parametrize("line", LINES, ids=lambda d: d["type"])
def test_a_fast_fold_accepts_refuses_and_folds_as_the_generic_path(
        line: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    assert line["type"] in FOLDS
    assert _fold({**_BASE, "seq": 1, **line}, True, monkeypatch)[0] == "folded"
    seen = set()
    for variant in _variants(line):
        d = {**_BASE, "seq": 1, **variant}
        fast = _fold(d, True, monkeypatch)
        slow = _fold(d, False, monkeypatch)
        assert fast[0] == slow[0], (d, fast[0], slow[0])
        if fast[0] == "folded":  # what a refused line did to the projection does not matter:
            assert fast[1] == slow[1], d  # the load starts over on the slow path
        seen.add(fast[0])
    assert seen == {"folded", "refused"}  # the variants tried both ways


def test_a_user_message_with_fragments_takes_the_generic_path() -> None:
    p = Projection()
    assert FOLDS["user/message"](p, {"type": "user/message", "text": "x",
                                     "fragments": []}) is False
    assert len(p) == 0
