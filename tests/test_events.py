"""Events: frozen, tagged, versioned; every type round-trips; unknown data survives."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from dsh.core.errors import LedgerError
from dsh.core.messages import Attachment
from dsh.core.messages import FragmentRef
from dsh.core.messages import Message
from dsh.core.messages import Reasoning
from dsh.core.messages import ToolCall
from dsh.core.messages import ToolSpec
from dsh.core.messages import Usage
from dsh.ledger.events import EVENT_TYPES
from dsh.ledger.events import AssistantMessage
from dsh.ledger.events import Event
from dsh.ledger.events import UnknownEvent
from dsh.ledger.serialize import dump_event
from dsh.ledger.serialize import load_event

GOLDEN = Path(__file__).parent / "data" / "golden.jsonl"

SAMPLES: dict[str, dict] = {
    "turn/start": {"turn": 1, "agent": "a", "model": "echo", "system": "be brief",
                   "tools": (ToolSpec(name="t", description="d",
                                      parameters={"type": "object"}),),
                   "options": {"temperature": 0.5}},
    "step/start": {"turn": 1, "step": 0},
    "user/message": {"text": "héllo \u2603", "source": "user",
                     "attachments": (Attachment(sha256="ab" * 32, media_type="image/png",
                                                size=3, name="p.png"),),
                     "fragments": (FragmentRef(sha256="cd" * 32, size=12, name="a.py"),)},
    "context/injected": {"text": "ctx", "source": "ci"},
    "assistant/message": {"text": "ok", "tool_calls": (ToolCall(id="c", name="t",
                                                                arguments={"x": [1, 2]}),),
                          "usage": Usage(input_tokens=3, output_tokens=4, cache_read_tokens=2),
                          "tool_call_source": "hermes", "model": "m", "stop_reason": "tool_use",
                          "reasoning": (Reasoning(kind="thinking", provider="anthropic",
                                                  text="hmm", signature="sig=="),
                                        Reasoning(kind="redacted_thinking", provider="anthropic",
                                                  data="EncRyPtEd"))},
    "tool/call": {"call_id": "c", "name": "t", "arguments": {"x": 1}},
    "tool/result": {"call_id": "c", "name": "t", "status": "error", "output": "bad",
                    "duration_ms": 1.5},
    "step/rejected": {"turn": 1, "step": 0, "reason": "no", "plugin": "p", "text": "t"},
    "step/end": {"turn": 1, "step": 0},
    "turn/end": {"turn": 1, "outcome": "completed", "reason": ""},
    "context/compacted": {
        "start": 1, "end": 4, "strategy": "summarize", "plugin": "dsh.compaction",
        "reason": "threshold", "tokens_before": 900, "tokens_after": 120,
        "summary_session": "20260101-000000.000-abcdef",
        "messages": (Message(role="user", content="<summary>…</summary>"),
                     Message(role="assistant", content="", tool_calls=(
                         ToolCall(id="c", name="t", arguments={"x": 1}),),
                             reasoning=(Reasoning(kind="reasoning", provider="openai-responses",
                                                  id="rs_1", data="enc"),)),
                     Message(role="tool", content="[omitted]", tool_call_id="c", name="t",
                             is_error=True))},
    "session/fork": {"parent": "20260101-000000.000-abcdef", "turn": 2, "parent_seq": 11,
                     "reason": "rewind"},
}


def test_every_event_type_has_a_sample():
    assert sorted(SAMPLES) == sorted(c.type for c in EVENT_TYPES)


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.type)
def test_round_trip(cls: type[Event]):
    event = cls(seq=7, ts="2026-11-30T00:00:00.000Z", session="s1", **SAMPLES[cls.type])
    line = dump_event(event)
    d = json.loads(line)
    assert d["type"] == cls.type and d["v"] == 1 and d["seq"] == 7 and d["session"] == "s1"
    back = load_event(line)
    assert back == event
    assert dump_event(back) == line


def test_events_are_frozen():
    e = AssistantMessage(text="x")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        e.text = "y"  # type: ignore[misc]


def test_unknown_fields_and_types_survive_round_trip():
    line = json.dumps({"v": 2, "type": "user/message", "seq": 1, "ts": "t", "session": "s",
                       "text": "hi", "source": "user", "mood": "happy"})
    e = load_event(line)
    assert e.text == "hi" and e.extra == {"mood": "happy", "v": 2}  # type: ignore[attr-defined]
    assert json.loads(dump_event(e))["mood"] == "happy"
    future = {"v": 3, "type": "plugin/thing", "seq": 2, "ts": "t", "session": "s", "x": [1]}
    u = load_event(json.dumps(future))
    assert isinstance(u, UnknownEvent) and u.tag == "plugin/thing" and u.seq == 2
    assert json.loads(dump_event(u)) == future


@pytest.mark.parametrize("line, message", [
    ('{"type": "tool/result", "seq": 1}', "invalid 'tool/result' event"),
    ('{"seq": 1}', "no 'type'"),
    ("[1, 2]", "must be a JSON object"),
    ('{"type": "step/start", "turn": "one", "step": 0}', "invalid 'step/start' event"),
])
def test_invalid_lines_are_clear_errors(line: str, message: str):
    with pytest.raises(LedgerError, match=message):
        load_event(line)


def test_golden_file_guards_tags_and_field_names():
    """Old ledgers keep loading: every golden line loads, and writes back every field it had
    with the same value (new optional fields may be added; renames and removals fail here)."""
    lines = GOLDEN.read_text().splitlines()
    events = [load_event(x) for x in lines]
    assert [e.type for e in events] == [json.loads(x)["type"] for x in lines]
    for line, event in zip(lines, events, strict=True):
        golden = json.loads(line)
        dumped = json.loads(dump_event(event))
        assert {k: dumped.get(k, "<missing>") for k in golden} == golden


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.type)
def test_generated_dumper_writes_what_the_generic_path_writes(cls: type[Event]):
    from dsh.ledger.serialize import _dumper
    from dsh.ledger.serialize import _generic_dict

    event = cls(seq=3, ts="t", session="s", **SAMPLES[cls.type])
    assert _dumper(cls) is not _generic_dict  # every built-in event gets a generated one
    assert _dumper(cls)(event) == _generic_dict(event)


def test_lines_without_reasoning_or_attachments_are_as_they_always_were():
    """Empty reasoning and attachments are not written: a line of a session that uses neither
    is byte for byte what dsh wrote before they existed."""
    from dsh.ledger.events import UserMessage
    from dsh.ledger.serialize import _dumper
    from dsh.ledger.serialize import _generic_dict

    said = AssistantMessage(seq=3, ts="t", session="s", text="ok",
                            usage=Usage(input_tokens=1, output_tokens=2))
    asked = UserMessage(seq=2, ts="t", session="s", text="hi")
    assert dump_event(said) == (
        '{"v":1,"type":"assistant/message","seq":3,"ts":"t","session":"s","text":"ok",'
        '"tool_calls":[],"usage":{"input_tokens":1,"output_tokens":2},'
        '"tool_call_source":null,"model":null,"stop_reason":null}')
    assert dump_event(asked) == ('{"v":1,"type":"user/message","seq":2,"ts":"t",'
                                 '"session":"s","text":"hi","source":"user"}')
    for event in (said, asked):
        assert _dumper(type(event))(event) == _generic_dict(event)
        assert load_event(dump_event(event)) == event


def test_the_generated_dumper_survives_resolved_types() -> None:
    """cattrs resolves a class's annotations into objects when it first structures one: a
    dumper generated after that must still be the generated one (it was the generic path)."""
    import attrs

    from dsh.ledger import serialize
    from dsh.ledger.events import TurnStarted

    attrs.resolve_types(TurnStarted)
    serialize._DUMPERS.pop(TurnStarted, None)
    assert serialize._dumper(TurnStarted) is not serialize._generic_dict
