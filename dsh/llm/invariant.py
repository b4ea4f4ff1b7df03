"""The C3 comparison: is a request what the session ledger records? (MISSION C3).

:func:`differences` lists what differs between a request and the expected one: O(1) when
every field is the recorded object itself (the normal path: identity tests), by value
otherwise — the values rebuilt from exact built-in types (:func:`_plain`), so no subclass with
a lying ``__eq__`` can pass. :func:`check` raises, and :func:`violation` words, the
:class:`~dsh.core.errors.InvariantViolation` that fails the turn before anything is sent.
:func:`dsh.llm.transport.send` runs the comparison where bytes leave.
"""

from __future__ import annotations

import operator
from typing import Any

import attrs

from dsh.core.errors import InvariantViolation
from dsh.core.messages import Attachment
from dsh.core.messages import FrozenDict
from dsh.core.messages import FrozenList
from dsh.core.messages import Message
from dsh.core.messages import MessageView
from dsh.core.messages import ModelRequest
from dsh.core.messages import Reasoning
from dsh.core.messages import ToolCall
from dsh.core.messages import ToolSpec

#: The record types a request holds, compared field by field (every field, so a field added
#: to one of them is compared too).
_RECORDS = tuple((cls, operator.attrgetter(*[f.name for f in attrs.fields(cls)]))
                 for cls in (Message, ToolCall, ToolSpec, Reasoning, Attachment))


class _Odd(Exception):
    """A value of a type a request cannot legitimately hold: the comparison says "differs"."""


def _plain(value: Any) -> Any:
    """``value`` rebuilt from exact built-in types, for a comparison no subclass can fool:
    scalars as they are, mappings as dicts, sequences as lists, a record (message, tool call,
    tool schema, reasoning part, attachment) as its class name and fields; any other type
    raises :class:`_Odd`."""
    t = type(value)
    if value is None or t is str or t is int or t is float or t is bool:
        return value
    if t is dict or t is FrozenDict:
        return {_plain(k): _plain(v) for k, v in dict.items(value)}
    if t is list or t is FrozenList or t is tuple or t is MessageView:
        return [_plain(v) for v in value]
    for cls, fields in _RECORDS:
        if t is cls:
            return (cls.__name__, *map(_plain, fields(value)))
    raise _Odd


def differences(request: Any, expected: ModelRequest) -> list[str]:
    """What differs between ``request`` and ``expected`` (empty: the same).

    O(1) when every field is the recorded object itself; by value otherwise.
    """
    return _differences(request, expected.model, expected.system, expected.messages,
                        expected.tools, expected.options)


def _differences(request: Any, model: str, system: str, view: Any, tools: Any,
                 options: Any) -> list[str]:
    if type(request) is not ModelRequest:
        return [f"the request is a {type(request).__name__}, not a dsh ModelRequest"]
    problems = []
    msgs = request.messages
    if not (type(msgs) is MessageView and type(view) is MessageView and view.same_as(msgs)):
        if _differ(msgs, view):
            n = len(msgs) if hasattr(msgs, "__len__") else "?"
            problems.append(f"messages differ ({n} sent, {len(view)} in the ledger)")
    if request.system is not system and _differ(request.system, system):
        problems.append("system prompt differs")
    if request.tools is not tools and _differ(request.tools, tools):
        problems.append("tool schemas differ")
    if request.model is not model and _differ(request.model, model):
        problems.append(f"model differs ({request.model!r} vs {model!r} recorded)")
    if request.options is not options and _differ(request.options, options):
        problems.append("model options differ")
    return problems


def _differ(a: Any, b: Any) -> bool:
    try:
        return bool(_plain(a) != _plain(b))
    except (_Odd, AttributeError, TypeError, RecursionError):
        return True


def check(request: Any, expected: Any) -> None:
    """Raise :class:`InvariantViolation` when ``request`` is not what ``expected`` (a sealed
    request, or anything with ``view()``, ``model``, ``system``, ``tools``, ``options`` such
    as a :class:`~dsh.ledger.history.Projection`) records."""
    if expected is None:
        return
    if not isinstance(expected, ModelRequest):
        expected = ModelRequest(model=expected.model, system=expected.system,
                                messages=expected.view(), tools=expected.tools,
                                options=expected.options)
    problems = differences(request, expected)
    if problems:
        raise violation(problems)


def violation(problems: list[str], plugin: str = "") -> InvariantViolation:
    who = (f"Plugin {plugin} changed it" if plugin else "Some plugin changed it")
    return InvariantViolation(
        "invariant C3 violated: the model request is not what the session ledger records: "
        + "; ".join(problems) + f". {who} without writing it to the ledger; nothing was sent.",
        plugin=plugin,
    )
