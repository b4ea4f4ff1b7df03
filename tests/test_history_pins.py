"""Pins for dsh/ledger/history.py that the differential raw-vs-event test cannot see (both paths
share them): the empty projection, optional fields left out of a line, the seq check, and
the plain-text transcript. Found by mutation testing (docs/testing.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.core.errors import LedgerError
from dsh.core.messages import Message
from dsh.core.messages import ToolCall
from dsh.ledger.events import StepEnded
from dsh.ledger.events import StepStarted
from dsh.ledger.events import UserMessage
from dsh.ledger.history import Projection
from dsh.ledger.history import context_message
from dsh.ledger.history import derive_messages
from dsh.ledger.history import render_history
from dsh.ledger.serialize import InvalidLine
from dsh.ledger.serialize import load_event


def _state(p: Projection) -> tuple:
    return (list(p.view()), p.system, p.tools, p.model, p.options, dict(p.pending), p.turn,
            p.step, p.turn_open, p.step_open, p.seq, p.last_usage, p.compactions, p.answers)


def test_an_empty_projection_is_an_empty_history_before_event_zero():
    p = Projection()
    assert _state(p) == ([], "", (), "", {}, {}, 0, 0, False, False, -1, None, 0, 0)
    assert len(p) == 0
    assert p.tools is not None and p.options is not None


# Every line with only its required keys: the raw path must fill in the same defaults as
# the event loader (a writer may omit any field that has a default).
MINIMAL: list[dict[str, Any]] = [
    {"type": "turn/start", "turn": 1, "agent": "a"},
    {"type": "step/start", "turn": 1, "step": 0},
    {"type": "user/message", "text": "hi"},
    {"type": "context/injected", "text": "ctx"},
    {"type": "assistant/message"},
    {"type": "assistant/message", "text": "calls",
     "tool_calls": [{"id": "c1", "name": "t"}]},
    {"type": "tool/result", "call_id": "c1", "name": "t"},
    {"type": "step/end", "turn": 1, "step": 0},
    {"type": "turn/end", "turn": 1, "outcome": "completed"},
    {"type": "assistant/message", "text": "counted",
     "usage": {"input_tokens": 120, "output_tokens": 30}},
    {"type": "assistant/message", "usage": {"input_tokens": 7}},
    {"type": "assistant/message", "usage": {"output_tokens": 5}},
    {"type": "assistant/message", "usage": {}},
    {"type": "context/compacted", "start": 0, "end": 2,
     "messages": [{"role": "user", "content": "summary"}]},
    {"type": "context/compacted", "start": 1, "end": 1},
]


def test_lines_without_optional_fields_project_like_the_event_loader():
    by_event, by_raw = Projection(), Projection()
    for seq, d in enumerate(MINIMAL):
        d = {**d, "seq": seq}
        by_event.apply(load_event(json.dumps(d)))
        by_raw.apply_raw(d)
        assert _state(by_raw) == _state(by_event), d
        if d["type"] == "turn/end":
            msgs = list(by_raw.view())
            assert msgs[1].content == '<context source="api">\nctx\n</context>'
            assert msgs[2] == Message(role="assistant", content="")
            assert msgs[4] == Message(role="tool", content="", tool_call_id="c1", name="t",
                                      is_error=False)
        if d.get("text") == "counted":
            assert by_raw.last_usage == (len(by_raw), 150)
    assert by_raw.seq == len(MINIMAL) - 1
    assert by_raw.answers == 6 and by_raw.compactions == 2 and by_raw.last_usage is None
    assert list(by_raw.view())[0] == Message(role="user", content="summary")


def test_usage_tracks_the_last_answer_that_reported_input_tokens():
    for apply in ("raw", "event"):
        p = Projection()

        def feed(d: dict[str, Any], p: Projection = p, apply: str = apply) -> None:
            d = {**d, "seq": p.seq + 1}
            if apply == "raw":
                p.apply_raw(d)
            else:
                p.apply(load_event(json.dumps(d)))

        feed({"type": "user/message", "text": "q"})
        feed({"type": "assistant/message", "usage": {"input_tokens": 10, "output_tokens": 4}})
        assert (p.last_usage, p.answers) == ((2, 14), 1)
        feed({"type": "user/message", "text": "q2"})
        feed({"type": "assistant/message", "usage": {"output_tokens": 9}})  # no prompt count
        assert (p.last_usage, p.answers) == ((2, 14), 2)
        feed({"type": "assistant/message", "usage": {"input_tokens": 3}})
        assert (p.last_usage, p.answers) == ((5, 3), 3)
        feed({"type": "context/compacted", "start": 0, "end": 4,
              "messages": [{"role": "user", "content": "s"}]})
        assert (p.last_usage, p.compactions, len(p)) == (None, 1, 2)
        assert [m.content for m in p.view()] == ["s", ""]


@pytest.mark.parametrize(("start", "end", "n", "ok"), [
    (0, 0, 3, True), (0, 3, 3, True), (3, 3, 3, True), (1, 2, 3, True),
    (-1, 2, 3, False), (2, 1, 3, False), (0, 4, 3, False), (4, 4, 3, False),
])
def test_compact_range_is_checked(start: int, end: int, n: int, ok: bool):
    from dsh.core.errors import LedgerError

    p = Projection()
    for i in range(n):
        p.apply(UserMessage(seq=i, text=str(i)))
    before = p.view()
    replacement = (Message(role="user", content="R"),)
    if ok:
        p.compact(start, end, replacement)
        expected = [str(i) for i in range(start)] + ["R"] + [str(i) for i in range(end, n)]
        assert [m.content for m in p.view()] == expected
        assert p.compactions == 1 and p.last_usage is None
        assert [m.content for m in before] == ["0", "1", "2"]  # an earlier view is kept
    else:
        with pytest.raises(LedgerError) as caught:
            p.compact(start, end, replacement)
        assert str(caught.value) == (f"context/compacted: range [{start}, {end}) outside the "
                                     f"{n} projected messages")
        assert p.compactions == 0 and len(p) == n


def test_every_compaction_is_counted():
    p = Projection()
    for i in range(4):
        p.apply(UserMessage(seq=i, text=str(i)))
    p.compact(0, 2, (Message(role="user", content="a"),))
    p.compact(0, 2, (Message(role="user", content="b"),))
    p.compact(1, 1, ())
    assert p.compactions == 3 and [m.content for m in p.view()] == ["b", "3"]


def test_compacted_lines_must_be_well_formed():
    for bad in ({"start": "0", "end": 1}, {"start": 0, "end": None}, {"end": 1},
                {"start": 0, "end": 1, "messages": [{"content": "no role"}]}):
        p = Projection()
        p.apply_raw({"type": "user/message", "seq": 0, "text": "x"})
        # refused on the raw (resume) path as `dsh sessions show` refuses it (issue 23): the
        # scan falls back to the slow path, which names the file and line
        with pytest.raises((InvalidLine, KeyError, LedgerError)):
            p.apply_raw({"type": "context/compacted", "seq": 1, **bad})


def test_step_end_closes_the_step_on_both_paths():
    raw, ev = Projection(), Projection()
    for p, apply in ((raw, raw.apply_raw), (ev, lambda d: ev.apply(load_event(json.dumps(d))))):
        apply({"type": "step/start", "seq": 0, "turn": 1, "step": 3})
        assert (p.step, p.step_open) == (3, True)
        apply({"type": "step/end", "seq": 1, "turn": 1, "step": 3})
        assert (p.step, p.step_open, p.seq) == (3, False, 1)


@pytest.mark.parametrize("seq", ["3", 1.0, None, True, [1]])
def test_a_seq_that_is_not_an_integer_is_an_invalid_line(seq: Any):
    p = Projection()
    with pytest.raises(InvalidLine):
        p.apply_raw({"type": "user/message", "seq": seq, "text": "x"})


@pytest.mark.parametrize("seq", [0, 7, 10**12])
def test_an_integer_seq_is_recorded(seq: int):
    p = Projection()
    p.apply_raw({"type": "step/end", "seq": seq, "turn": 1, "step": 0})
    assert p.seq == seq


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(
    [d for d in MINIMAL if d["type"] != "context/compacted"]
    + [{"type": "context/compacted", "start": 0, "end": 0,
        "messages": [{"role": "user", "content": "s"}]}]), max_size=12))
def test_any_order_of_minimal_lines_projects_alike(lines: list[dict[str, Any]]):
    by_event, by_raw = Projection(), Projection()
    for seq, d in enumerate(lines):
        d = {**d, "seq": seq}
        by_event.apply(load_event(json.dumps(d)))
        by_raw.apply_raw(d)
    assert _state(by_raw) == _state(by_event)


def test_derive_messages_of_nothing_is_empty():
    assert list(derive_messages([])) == []
    assert [m.content for m in derive_messages([UserMessage(text="a"), StepStarted(turn=1, step=0),
                                                StepEnded(turn=1, step=0),
                                                UserMessage(text="b")])] == ["a", "b"]


def test_context_message_format():
    assert context_message("x\ny", "ci") == '<context source="ci">\nx\ny\n</context>'


def test_render_history_transcript_exact():
    messages = [
        Message(role="user", content="  hello  "),
        Message(role="assistant", content="looking",
                tool_calls=(ToolCall(id="1", name="grep", arguments={"q": "café"}),
                            ToolCall(id="2", name="ls", arguments={}))),
        Message(role="tool", content="no match", tool_call_id="1", name="grep", is_error=True),
        Message(role="tool", content="a b", tool_call_id="2", name="ls"),
        Message(role="assistant", content="done"),
    ]
    assert render_history(messages) == (
        "[user] hello\n"
        '[assistant] looking\n[calls grep({"q": "café"})]\n[calls ls({})]\n'
        "[tool grep result (error)] no match\n"
        "[tool ls result] a b\n"
        "[assistant] done"
    )
    assert render_history([]) == ""


def test_render_history_calls_without_text():
    m = Message(role="assistant", tool_calls=(ToolCall(id="1", name="f", arguments={"n": 1}),))
    assert render_history([m]) == '[assistant] [calls f({"n": 1})]'


def test_a_sealed_projection_indexes_plugin_events_for_the_ledger_only():
    from dsh.ledger.events import PluginEvent
    from dsh.ledger.history import _LEDGER

    p = Projection()
    event = PluginEvent(plugin="p", name="n", data={"i": 1})
    p.index_plugin_event(event)  # a projection being built (a load, a reader) takes anyone's
    p.seal()
    with pytest.raises(LedgerError) as err:
        p.index_plugin_event(event)
    assert str(err.value) == (
        "Projection.index_plugin_event: the projection of an open session ledger is read-only "
        "(MISSION C3): what reaches the model is what the ledger file records; write an event "
        "with ledger.append (or dsh.plugin_events) instead")
    p.index_plugin_event(event, _LEDGER)
    p.apply(event, _LEDGER)  # the ledger folding a plugin event it wrote: indexed
    assert p.plugin_index is not None
    assert list(p.plugin_index[("p", "n")]) == [event] * 3 == list(p.plugin_index["p"])
