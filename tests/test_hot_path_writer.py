"""The ledger writer's fast paths keep the byte rule: what the projection folds is
what decoding the written line gives, whatever the objects handed to ``append`` were.

* ``serialize.dumps`` (the C encoder called directly) writes the same text as the
  ``JSONEncoder`` it stands in for, on every event type;
* an answer with tool calls whose arguments are plain JSON values is encoded from a private
  copy that the projection folds (no decode); anything else — a subclass, a non-``str`` key,
  an object — takes the decode path, and either way the projection equals the one a fresh
  load of the file builds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from dsh.core.messages import FrozenDict
from dsh.core.messages import ToolCall
from dsh.core.messages import Usage
from dsh.ledger import serialize
from dsh.ledger import writer
from dsh.ledger.events import AssistantMessage
from dsh.ledger.events import StepEnded
from dsh.ledger.events import StepStarted
from dsh.ledger.events import ToolCalled
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import TurnStarted
from dsh.ledger.events import UserMessage
from dsh.ledger.history import Projection
from dsh.ledger.store import JsonlStore


class Str(str):
    pass


class Dict(dict):  # type: ignore[type-arg]
    pass


class Obj:
    def __str__(self) -> str:
        return "obj"


PLAIN = [{}, {"x": 1}, {"a": [1, 2.5, None, True, "é\u2028"], "b": {"c": {"d": []}}},
         {"big": 10 ** 40, "neg": -0.0, "t": (1, 2)}, FrozenDict({"f": FrozenDict({"g": 1})})]
HOSTILE = [{"s": Str("lie")}, {Str("k"): 1}, {1: "int key"}, {"d": Dict(a=1)}, Dict(x=1),
           # deeper than the copy goes: left to the decoder's own limits
           {"deep": json.loads("[" * 100 + "]" * 100)}]
#: plain too: NaN is written ``NaN`` and read back a NaN (the stdlib codec's rule)
PLAIN.append({"n": float("nan"), "inf": -math.inf})


def _state(p: Any) -> tuple[Any, ...]:
    msgs = [(m.role, m.content, tuple((c.id, c.name, json.dumps(dict(c.arguments), default=str))
                                      for c in m.tool_calls)) for m in p.view()]
    return msgs, sorted(p.pending), p.seq, p.answers, p.last_usage


@pytest.mark.parametrize("arguments", PLAIN + HOSTILE)
def test_an_answer_with_tool_calls_is_folded_as_its_line_decodes(
        tmp_path: Path, arguments: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    copies = []
    real = writer._own_calls
    monkeypatch.setattr(writer, "_own_calls", lambda e: copies.append(real(e)) or copies[-1])
    store = JsonlStore(tmp_path)
    with store.create() as ledger:
        ledger.append(TurnStarted, turn=1, agent="a", model="m")
        ledger.append(StepStarted, turn=1, step=0)
        call = ToolCall(id="c1", name="t", arguments={})
        object.__setattr__(call, "arguments", arguments)  # whatever a plugin managed to put
        ledger.append(AssistantMessage, text="", tool_calls=(call,),
                      usage=Usage(input_tokens=5, output_tokens=1))
        if type(arguments) is dict and arguments:  # changed in place after it was recorded
            dict.__setitem__(arguments, "later", "EVIL")
        live = _state(ledger.projection)
        path = ledger.path
    assert "EVIL" not in json.dumps(live, default=str)
    fresh = Projection()  # the file's lines decoded and folded, as a resume folds them
    for line in path.read_bytes().splitlines():
        fresh.apply_raw(json.loads(line))
    assert _state(fresh) == live
    plain = any(arguments is p for p in PLAIN)
    assert (copies[-1] is not None) == plain  # plain values folded from the copy, others decoded


def _events() -> list[Any]:
    from dsh.core.messages import Change

    return [
        TurnStarted(seq=0, ts="t", session="s", turn=1, agent="a", model="m", system="é",
                    options={"k": [1, 2.5]}, trust=({"path": "p", "sha256": "0"},), mode="ask"),
        StepStarted(seq=1, ts="t", session="s", turn=1, step=0),
        UserMessage(seq=2, ts="t", session="s", text="hi\n\u2028\x00\"\\"),
        AssistantMessage(seq=3, ts="t", session="s", text="x", tool_calls=(
            ToolCall(id="c", name="n", arguments={"a": 1e-7, "b": 1e16}),),
            usage=Usage(input_tokens=1, output_tokens=2, cache_read_tokens=3)),
        ToolCalled(seq=4, ts="t", session="s", call_id="c", name="n", arguments={"a": None}),
        ToolReturned(seq=5, ts="t", session="s", call_id="c", name="n", output="o",
                     duration_ms=0.25, changes=(Change(path="a", op="add", diff="+x\n"),)),
        StepEnded(seq=6, ts="t", session="s", turn=1, step=0, extra={"future": [1]}),
    ]


def test_the_direct_c_encoder_writes_the_same_text_as_the_json_encoder() -> None:
    assert serialize.dumps is not serialize._dumps  # CPython: the direct path is in use
    for event in _events():
        d = serialize.event_to_dict(event)
        assert serialize.dumps(d) == serialize._ENCODER.encode(d)
        line, _ = writer._encoded(event)
        assert line == (serialize.dump_event(event) + "\n").encode()
    with pytest.raises(ValueError, match="Circular"):
        cyclic: list[Any] = []
        cyclic.append(cyclic)
        serialize.dumps({"a": cyclic})
    assert serialize.dumps({"b": 1}) == '{"b":1}'  # a failed call leaves nothing behind
    with pytest.raises(TypeError):
        serialize.dumps({"o": Obj()})
