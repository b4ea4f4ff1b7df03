"""The projection's fast folds of the lines every step writes, straight from decoded JSON.

:meth:`dsh.ledger.history.Projection.apply_raw` folds a decoded ledger line: it checks the
line as :meth:`dsh.ledger.serialize.EventCodec.from_dict` would (``check_raw``) and then takes
the values the projection needs. For the seven tags that make up nearly every line of a
session (``step/start``, ``step/end``, ``tool/call``, ``assistant/message``, ``tool/result``,
``user/message`` and ``turn/end``) the two passes are one here: each field is checked once,
by exact type, and nothing is built only to be checked (a ``Usage``, a changes tuple). The
lines accepted and refused, and what is folded, are those of the generic path (every other
tag, and a user message with fragments, still take it); ``tests/test_ledger_folds.py``
compares the two over valid lines and over every field made wrong in turn.

A fold raises :class:`~dsh.ledger.parts.InvalidLine` or ``KeyError`` for a line the codec
would refuse, before it changes the projection, and returns ``False`` for a line it leaves
to the generic path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsh.core.messages import Message
from dsh.ledger.parts import InvalidLine
from dsh.ledger.parts import raw_attachments
from dsh.ledger.parts import raw_changes
from dsh.ledger.parts import raw_reasoning
from dsh.ledger.parts import raw_tool_calls

_OPTIONAL_STR = (str, type(None))
_DURATION = (float, int, type(None))


def _step_start(p: Any, d: dict[str, Any]) -> bool:
    step = d["step"]
    if type(d["turn"]) is not int or type(step) is not int:
        raise InvalidLine("step")
    p.step = step
    p.step_open = True
    return True


def _step_end(p: Any, d: dict[str, Any]) -> bool:
    if type(d["turn"]) is not int or type(d["step"]) is not int:
        raise InvalidLine("step")
    p.step_open = False
    return True


def _turn_end(p: Any, d: dict[str, Any]) -> bool:
    if (type(d["turn"]) is not int or type(d["outcome"]) is not str
            or ("reason" in d and type(d["reason"]) is not str)):
        raise InvalidLine("turn")
    p.turn_open = False
    p.step_open = False
    return True


def _tool_call(p: Any, d: dict[str, Any]) -> bool:
    if (type(d["call_id"]) is not str or type(d["name"]) is not str
            or ("arguments" in d and type(d["arguments"]) is not dict)
            or ("child_session" in d and type(d["child_session"]) not in _OPTIONAL_STR)):
        raise InvalidLine("call_id")
    return True  # the projection takes nothing from a call line but its seq


def _answer(p: Any, d: dict[str, Any]) -> bool:
    for name in ("tool_call_source", "model", "stop_reason"):
        if name in d and type(d[name]) not in _OPTIONAL_STR:
            raise InvalidLine(name)
    usage = None
    if "usage" in d:
        u = d["usage"]
        if type(u) is not dict:
            raise InvalidLine("usage")
        i, o = u.get("input_tokens", 0), u.get("output_tokens", 0)
        if (type(i) is not int or type(o) is not int
                or type(u.get("cache_read_tokens", 0)) is not int
                or type(u.get("cache_write_tokens", 0)) is not int):
            raise InvalidLine("usage")
        if u and i:
            usage = i + o
    text = d.get("text", "")
    if type(text) is not str:
        raise InvalidLine("text")
    calls = raw_tool_calls(d["tool_calls"]) if "tool_calls" in d else ()
    reasoning = raw_reasoning(d["reasoning"]) if "reasoning" in d else ()
    messages = p._messages
    messages.append(Message(role="assistant", content=text, tool_calls=calls,
                            reasoning=reasoning))
    pending = p.pending
    for call in calls:
        pending[call.id] = call
    p.answers += 1
    if usage is not None:
        p.last_usage = (len(messages), usage)
    return True


def _result(p: Any, d: dict[str, Any]) -> bool:
    call_id, name = d["call_id"], d["name"]
    output, status = d.get("output", ""), d.get("status", "ok")
    if (type(call_id) is not str or type(name) is not str or type(output) is not str
            or type(status) is not str
            or ("duration_ms" in d and type(d["duration_ms"]) not in _DURATION)):
        raise InvalidLine("call_id")
    if "changes" in d:
        if type(d["changes"]) is not list:
            raise InvalidLine("changes")
        raw_changes(d["changes"])  # checked as the codec checks it; the projection drops it
    p.pending.pop(call_id, None)
    p._messages.append(Message(role="tool", content=output, tool_call_id=call_id, name=name,
                               is_error=status != "ok"))
    return True


def _user(p: Any, d: dict[str, Any]) -> bool:
    if "fragments" in d:
        return False  # its text is read from the blob store: the generic path
    text = d["text"]
    if type(text) is not str or ("source" in d and type(d["source"]) is not str):
        raise InvalidLine("text")
    attachments = raw_attachments(d["attachments"]) if "attachments" in d else ()
    p._messages.append(Message(role="user", content=text, attachments=attachments))
    return True


#: The fast folds by line tag (see the module's docstring).
FOLDS: dict[str, Callable[[Any, dict[str, Any]], bool]] = {
    "step/start": _step_start,
    "step/end": _step_end,
    "turn/end": _turn_end,
    "tool/call": _tool_call,
    "assistant/message": _answer,
    "tool/result": _result,
    "user/message": _user,
}
