"""What ``dsh replay`` drives a session with: its recorded ledger read into turns (issue 37).

:func:`read_plan` folds a stored session's events, in order, through the ledger's own
:class:`~dsh.ledger.history.Projection` — exactly as the ledger fed it when the session ran —
and keeps, for every ``assistant/message``, the request recorded as sent there (the projection
of every line before it, as the transport sealed it: MISSION C3) with the answer that came
back; and for every turn, the inputs that came from outside the loop:

* the turn's first message (text, attachments; the text of a rejected first step) and the
  context injected before it;
* messages steered in during the turn (a ``user/message`` of a later step whose source is not
  a plugin's follow-up), with their context: given to the run during the request before them;
* events written between turns (plugin events, a ``dsh sessions compact``);
* compactions recorded inside a turn, at the request they came before;
* the recorded results of the tool calls (by call id), and the plugin events written while a
  step's tools ran (tools are not run again, so neither are their effects).

Everything else — the system prompt, tool schemas, options, ``pre_step`` rewrites,
``turn_stopping`` follow-ups, the projection — is left to today's code to produce again.
"""

from __future__ import annotations

from typing import Any

import attrs

from dsh.core.messages import Attachment
from dsh.core.messages import ModelRequest
from dsh.ledger.events import AssistantMessage
from dsh.ledger.events import ContextCompacted
from dsh.ledger.events import ContextInjected
from dsh.ledger.events import PluginEvent
from dsh.ledger.events import StepEnded
from dsh.ledger.events import StepRejected
from dsh.ledger.events import StepStarted
from dsh.ledger.events import ToolCalled
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import TurnEnded
from dsh.ledger.events import TurnStarted
from dsh.ledger.events import UserMessage
from dsh.ledger.history import Projection

#: Compactions dsh's trigger makes by itself after the hook's answer (the last resorts): today's
#: code makes them again, they are never handed to the ``compact_context`` hook.
OWN_COMPACTIONS = frozenset({"truncate", "drop-oversized"})


@attrs.define(eq=False)
class Expected:
    """One request recorded as sent, and what answered it."""

    #: 1-based, over the session.
    index: int
    turn: int
    #: The step of the turn (from 0) the request belongs to.
    step: int
    #: ``seq`` of its ``assistant/message``.
    seq: int
    #: The request: the projection of every line before the answer.
    request: ModelRequest
    response: AssistantMessage
    #: A message steered in during this request: ``(context items, text, source)``.
    steer: tuple[list[tuple[str, str]], str, str] | None = None
    #: Context-length refusals (compactions with reason ``provider``) before it was answered.
    refusals: int = 0
    #: Plugin events written while this step's tools ran, in order.
    tool_events: list[PluginEvent] = attrs.Factory(list)


@attrs.define(eq=False)
class RecordedTurn:
    number: int
    agent: str
    #: The model id the turn's requests named (turn/start, or the last one before it).
    model: str
    #: The permission mode in force (None: never recorded, an older ledger).
    mode: str | None
    outcome: str = ""
    reason: str = ""
    #: Events written before this turn, after the previous one (plugin events, compactions).
    before: list[Any] = attrs.Factory(list)
    context: list[tuple[str, str]] = attrs.Factory(list)
    text: str = ""
    attachments: tuple[Attachment, ...] = ()
    requests: list[Expected] = attrs.Factory(list)
    #: ``(index of the request it came before, event)`` of compactions inside the turn.
    compactions: list[tuple[int, ContextCompacted]] = attrs.Factory(list)
    #: Inputs that cannot be given again, as notes (a steered message's attachments…).
    notes: list[str] = attrs.Factory(list)
    #: Sub-agent child sessions its tool calls ran in.
    children: list[str] = attrs.Factory(list)


@attrs.define(eq=False)
class Plan:
    session: str
    turns: list[RecordedTurn]
    requests: list[Expected]
    #: Recorded tool results by call id.
    results: dict[str, ToolReturned]
    #: Events after the last turn (kept for completeness; nothing follows them).
    after: list[Any] = attrs.Factory(list)


def _text(message: UserMessage, blobs: Any) -> str:
    """What the user gave in ``message``: its ``-f`` fragments' blocks, then its text."""
    if not message.fragments:
        return message.text
    from dsh.ledger.fragments import expand

    return expand(blobs, message.fragments, message.text)


def _is_follow_up(source: str) -> bool:
    """A ``user/message`` a plugin's ``turn_stopping`` wrote (today's plugins write it again)."""
    return source.startswith("plugin:")


def read_plan(session: str, events: list[Any], blobs: Any = None) -> Plan:
    """The plan of ``events`` (a whole session, oldest first). ``blobs``: where the session's
    ``-f`` fragments are kept (:class:`dsh.ledger.fragments.DirectoryBlobs`), for a message
    that names some: it is given again with their blocks before its text."""
    proj = Projection()
    proj.blobs = blobs
    turns: list[RecordedTurn] = []
    requests: list[Expected] = []
    results: dict[str, ToolReturned] = {}
    outside: list[Any] = []
    cur: RecordedTurn | None = None
    mode: str | None = None
    step_context: list[tuple[str, str]] = []
    has_input = False
    tools_open = False
    for e in events:
        t = type(e)
        if t is TurnStarted:
            proj.apply(e)
            if e.mode is not None:
                mode = e.mode
            cur = RecordedTurn(number=e.turn, agent=e.agent, model=proj.model, mode=mode,
                               before=outside)
            outside = []
            turns.append(cur)
            has_input = False
            step_context = []
            tools_open = False
            continue
        if cur is None or not proj.turn_open:
            if t is PluginEvent or t is ContextCompacted:
                outside.append(e)
            proj.apply(e)
            continue
        if t is StepStarted:
            step_context = []
            tools_open = False
        elif t is ContextInjected:
            step_context.append((e.text, e.source))
        elif t is UserMessage:
            if not has_input:
                has_input = True
                cur.context, cur.text, cur.attachments = step_context, _text(e, blobs), \
                    e.attachments
            elif not _is_follow_up(e.source):
                if cur.requests and cur.requests[-1].steer is None:
                    cur.requests[-1].steer = (step_context, _text(e, blobs), e.source)
                    if e.attachments:
                        cur.notes.append(f"turn {cur.number}: the attachments of a message "
                                         "steered in are not given again")
                else:
                    cur.notes.append(f"turn {cur.number}: a message steered in before the "
                                     "turn's first request is not given again")
            step_context = []
        elif t is StepRejected:
            if not has_input:
                has_input = True
                cur.context, cur.text = step_context, e.text
            step_context = []
        elif t is ContextCompacted:
            # before the next request (reason ``provider``: after the provider refused it)
            cur.compactions.append((len(requests) + 1, e))
        elif t is AssistantMessage:
            req = ModelRequest(model=proj.model, system=proj.system, messages=proj.view(),
                               tools=proj.tools, options=proj.options)
            refusals = sum(1 for i, c in cur.compactions
                           if i == len(requests) + 1 and c.reason == "provider")
            exp = Expected(index=len(requests) + 1, turn=cur.number, step=proj.step,
                           seq=e.seq, request=req, response=e, refusals=refusals)
            requests.append(exp)
            cur.requests.append(exp)
            tools_open = bool(e.tool_calls)
        elif t is ToolCalled:
            if e.child_session:
                cur.children.append(e.child_session)
        elif t is ToolReturned:
            results[e.call_id] = e
        elif t is PluginEvent:
            if tools_open and cur.requests:
                cur.requests[-1].tool_events.append(e)
        elif t is StepEnded:
            tools_open = False
        elif t is TurnEnded:
            cur.outcome, cur.reason = e.outcome, e.reason
        proj.apply(e)
    return Plan(session=session, turns=turns, requests=requests, results=results,
                after=outside)
