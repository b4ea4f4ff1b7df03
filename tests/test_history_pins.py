"""Pins for dsh/history.py that the differential raw-vs-event test cannot see (both paths
share them): the empty projection, optional fields left out of a line, the seq check, and
the plain-text transcript. Found by mutation testing (docs/testing.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.events import StepEnded
from dsh.events import StepStarted
from dsh.events import UserMessage
from dsh.history import Projection
from dsh.history import context_message
from dsh.history import derive_messages
from dsh.history import render_history
from dsh.messages import Message
from dsh.messages import ToolCall
from dsh.serialize import InvalidLine
from dsh.serialize import load_event


def _state(p: Projection) -> tuple:
    return (list(p.view()), p.system, p.tools, p.model, p.options, dict(p.pending), p.turn,
            p.step, p.turn_open, p.step_open, p.seq)


def test_an_empty_projection_is_an_empty_history_before_event_zero():
    p = Projection()
    assert _state(p) == ([], "", (), "", {}, {}, 0, 0, False, False, -1)
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
]


def test_lines_without_optional_fields_project_like_the_event_loader():
    by_event, by_raw = Projection(), Projection()
    for seq, d in enumerate(MINIMAL):
        d = {**d, "seq": seq}
        by_event.apply(load_event(json.dumps(d)))
        by_raw.apply_raw(d)
        assert _state(by_raw) == _state(by_event), d
    msgs = list(by_raw.view())
    assert msgs[1].content == '<context source="api">\nctx\n</context>'
    assert msgs[2] == Message(role="assistant", content="")
    assert msgs[4] == Message(role="tool", content="", tool_call_id="c1", name="t",
                              is_error=False)
    assert by_raw.seq == len(MINIMAL) - 1


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
@given(st.lists(st.sampled_from(MINIMAL), max_size=12))
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
