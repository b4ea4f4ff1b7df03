"""The projection: the fast raw path equals the event path; derive_messages folds events."""

from __future__ import annotations

import json

import attrs
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.core.messages import Attachment
from dsh.core.messages import Reasoning
from dsh.core.messages import ToolCall
from dsh.core.messages import ToolSpec
from dsh.core.messages import Usage
from dsh.ledger.events import AssistantMessage
from dsh.ledger.events import ContextInjected
from dsh.ledger.events import PluginEvent
from dsh.ledger.events import StepEnded
from dsh.ledger.events import StepStarted
from dsh.ledger.events import ToolCalled
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import TurnEnded
from dsh.ledger.events import TurnStarted
from dsh.ledger.events import UnknownEvent
from dsh.ledger.events import UserMessage
from dsh.ledger.history import Projection
from dsh.ledger.history import derive_messages
from dsh.ledger.serialize import event_to_dict
from dsh.ledger.serialize import load_event

text = st.text(max_size=12)
ids = st.sampled_from(["c1", "c2", "c3"])
args = st.dictionaries(st.sampled_from(["a", "b"]), st.integers() | st.text(max_size=4),
                       max_size=2)
calls = st.lists(st.builds(ToolCall, id=ids, name=text, arguments=args), max_size=3)
specs = st.none() | st.lists(st.builds(ToolSpec, name=text, description=text,
                                       parameters=st.just({"type": "object"})), max_size=2)

events = st.one_of(
    st.builds(TurnStarted, turn=st.integers(1, 9), agent=text, model=st.none() | text,
              system=st.none() | text, tools=specs.map(lambda v: None if v is None else tuple(v)),
              options=st.none() | st.dictionaries(text, st.integers(), max_size=2)),
    st.builds(StepStarted, turn=st.integers(1, 9), step=st.integers(0, 9)),
    st.builds(UserMessage, text=text, source=text, attachments=st.lists(st.builds(
        Attachment, sha256=text, media_type=text, size=st.integers(0, 2**40),
        name=st.none() | text), max_size=2).map(tuple)),
    st.builds(ContextInjected, text=text, source=text),
    st.builds(AssistantMessage, text=text, tool_calls=calls.map(tuple),
              usage=st.builds(Usage, input_tokens=st.integers(0, 99),
                              output_tokens=st.integers(0, 99),
                              cache_read_tokens=st.integers(0, 99)),
              reasoning=st.lists(st.builds(
                  Reasoning, kind=text, provider=text, text=text,
                  signature=st.none() | text, data=st.none() | text,
                  id=st.none() | text), max_size=2).map(tuple)),
    st.builds(ToolCalled, call_id=ids, name=text, arguments=args),
    st.builds(ToolReturned, call_id=ids, name=text,
              status=st.sampled_from(["ok", "error", "interrupted"]), output=text),
    st.builds(StepEnded, turn=st.integers(1, 9), step=st.integers(0, 9)),
    st.builds(TurnEnded, turn=st.integers(1, 9), outcome=st.sampled_from(["completed", "error"])),
    st.builds(UnknownEvent, tag=st.just("plugin/x"),
              extra=st.just({"type": "plugin/x", "seq": 0, "x": 1})),
    st.builds(PluginEvent, plugin=st.sampled_from(["p", "dsh-hooks"]),
              name=st.sampled_from(["a", "b.c"]), version=st.integers(1, 3),
              data=st.dictionaries(text, st.recursive(
                  st.none() | st.booleans() | st.integers() | text,
                  lambda inner: st.lists(inner, max_size=2)
                  | st.dictionaries(text, inner, max_size=2), max_leaves=4), max_size=3)),
)


def _state(p: Projection) -> tuple:
    plugin = {k: [event_to_dict(e) for e in v] for k, v in (p.plugin_index or {}).items()}
    return (list(p.view()), p.system, p.tools, p.model, p.options, dict(p.pending), p.turn,
            p.step, p.turn_open, p.step_open, p.seq, plugin)


def test_plugin_events_are_indexed_and_never_projected_on_either_path():
    evs = [PluginEvent(plugin="p", name="a", data={"n": i}) for i in range(3)]
    evs.insert(1, PluginEvent(plugin="p", name="b", data={"text": "not for the model"}))
    by_event, by_raw = Projection(), Projection()
    for i, e in enumerate(evs):
        d = json.loads(json.dumps(event_to_dict(attrs.evolve(e, seq=i))))
        by_event.apply(load_event(json.dumps(d)))
        by_raw.apply_raw(d)
    for p in (by_event, by_raw):
        assert len(p) == 0 and p.seq == 3
        assert p.plugin_index is not None
        assert [e.data["n"] for e in p.plugin_index["p", "a"]] == [0, 1, 2]
        assert [e.name for e in p.plugin_index["p"]] == ["a", "b", "a", "a"]
    assert Projection().plugin_index is None  # a session without plugin events: no index


@settings(max_examples=300, deadline=None)
@given(st.lists(events, max_size=25))
def test_raw_path_projects_exactly_like_the_event_path(seq_events):
    by_event, by_raw = Projection(), Projection()
    for i, e in enumerate(seq_events):
        d = event_to_dict(e)
        d["seq"] = i
        d = json.loads(json.dumps(d))  # exactly what a ledger line decodes to
        by_event.apply(load_event(json.dumps(d)))
        by_raw.apply_raw(d)
    assert _state(by_raw) == _state(by_event)


def test_derive_messages_folds_a_session():
    evs = [
        TurnStarted(turn=1, agent="a", model="m", system="sys"),
        StepStarted(turn=1, step=0),
        ContextInjected(text="ctx", source="ci"),
        UserMessage(text="hi"),
        AssistantMessage(tool_calls=(ToolCall(id="c", name="t", arguments={}),)),
        ToolCalled(call_id="c", name="t"),
        ToolReturned(call_id="c", name="t", status="error", output="bad"),
        StepEnded(turn=1, step=0),
        TurnEnded(turn=1, outcome="completed"),
    ]
    msgs = list(derive_messages(evs))
    assert [m.role for m in msgs] == ["user", "user", "assistant", "tool"]
    assert msgs[0].content == '<context source="ci">\nctx\n</context>'
    assert msgs[3].is_error and msgs[3].tool_call_id == "c"
