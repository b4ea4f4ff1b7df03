"""``derive_messages``: the projection of the ledger into model messages (MISSION C3, C4).

The projection is a fold over events. The ledger feeds it every event it appends, so it is
maintained incrementally: a step costs the same at event 10 and at event 100,000. Resuming a
session folds the loaded events through the same code, which is why a resumed session's next
request is the one it would have sent before the restart.
"""

from __future__ import annotations

import json
import operator
import threading
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from typing import Any
from typing import SupportsIndex
from typing import overload

from dsh.core.messages import FrozenDict
from dsh.core.messages import Message
from dsh.core.messages import MessageView
from dsh.core.messages import ToolCall
from dsh.core.messages import ToolSpec
from dsh.core.messages import freeze
from dsh.ledger.events import AssistantMessage
from dsh.ledger.events import ContextCompacted
from dsh.ledger.events import ContextInjected
from dsh.ledger.events import Event
from dsh.ledger.events import PluginEvent
from dsh.ledger.events import StepEnded
from dsh.ledger.events import StepStarted
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import TurnEnded
from dsh.ledger.events import TurnStarted
from dsh.ledger.events import UserMessage
from dsh.ledger.folds import FOLDS
from dsh.ledger.plugin_events import checked_raw
from dsh.ledger.plugin_events import from_checked
from dsh.ledger.serialize import check_raw
from dsh.ledger.serialize import checked
from dsh.ledger.serialize import raw_attachments
from dsh.ledger.serialize import raw_fragments
from dsh.ledger.serialize import raw_messages
from dsh.ledger.serialize import raw_reasoning
from dsh.ledger.serialize import raw_tool_calls
from dsh.ledger.serialize import raw_tools

#: What only the ledger passes to a sealed projection's :meth:`Projection.apply` and
#: :meth:`Projection.apply_raw` (issue 23: the projection is read-only to everyone else).
_LEDGER = object()


def _read_only(what: str) -> Exception:
    from dsh.core.errors import LedgerError

    return LedgerError(
        f"Projection.{what}: the projection of an open session ledger is read-only (MISSION "
        "C3): what reaches the model is what the ledger file records; write an event with "
        "ledger.append (or dsh.plugin_events) instead")


def context_message(text: str, source: str) -> str:
    """How injected context is shown to the model (a user-role message of its own)."""
    return f'<context source="{source}">\n{text}\n</context>'


class Projection:
    """What the next request will contain, derived from the events so far.

    ``messages`` is append-only; :meth:`view` returns an O(1) immutable view of it.
    ``system``, ``tools``, ``model`` and ``options`` follow the latest ``turn/start`` that set
    them. ``pending`` holds tool calls the model made that have no result yet, in call order.
    """

    __slots__ = (
        "_messages",
        "system",
        "tools",
        "model",
        "options",
        "cwd",
        "pending",
        "turn",
        "step",
        "turn_open",
        "step_open",
        "seq",
        "last_usage",
        "compactions",
        "answers",
        "plugin_index",
        "states",
        "blobs",
        "_sealed",
    )

    def __init__(self) -> None:
        self._messages: list[Message] = []
        self.system = ""
        self.tools: tuple[ToolSpec, ...] = ()
        self.model = ""
        self.options: Mapping[str, Any] = FrozenDict()
        #: The working directory last recorded on a ``turn/start`` (never sent to a model).
        self.cwd: str | None = None
        self.pending: dict[str, ToolCall] = {}
        self.turn = 0
        self.step = 0
        self.turn_open = False
        self.step_open = False
        self.seq = -1
        #: ``(number of messages, tokens)``: the provider's count of the prompt and answer
        #: of the last assistant message that reported usage (None after a compaction).
        self.last_usage: tuple[int, int] | None = None
        #: How many ``context/compacted`` events have been applied.
        self.compactions = 0
        #: Assistant messages in the whole session, compacted ones included.
        self.answers = 0
        #: Plugin events (``x/PLUGIN/NAME``), never projected into messages: by plugin and by
        #: ``(plugin, name)``, oldest first (dsh.plugin_events). None until the first one.
        self.plugin_index: dict[Any, list[PluginEvent]] | None = None
        #: Recorded state (dsh.ledger.state): ``{StateKey: (events folded, value)}``, filled
        #: as keys are read; None until the first read.
        self.states: dict[Any, tuple[int, Any]] | None = None
        #: The session's blob store, where a user message's fragment texts are read from
        #: (dsh.ledger.fragments): set by the ledger or reader that owns this projection.
        self.blobs: Any = None
        #: Set by the ledger that owns this projection: then only it can fold events in.
        self._sealed = False

    def seal(self) -> None:
        """Make :meth:`apply`, :meth:`apply_raw`, :meth:`compact` and
        :meth:`index_plugin_event` refuse every caller but the ledger (which feeds it the
        events decoded from the bytes it wrote)."""
        self._sealed = True

    def view(self) -> MessageView:
        return MessageView(self._messages)

    def __len__(self) -> int:
        return len(self._messages)

    def apply(self, event: Event, _key: object = None,
              calls: tuple[ToolCall, ...] | None = None) -> None:
        """Fold ``event``; ``calls``, for an answer, the tool calls to fold in place of its
        own (the ledger's private copies of what the line was encoded from)."""
        if self._sealed and _key is not _LEDGER:
            raise _read_only("apply")
        self.seq = event.seq
        t = type(event)
        if t is UserMessage:
            m: Any = event
            text = m.text if not m.fragments else _expand(self.blobs, m.fragments, m.text)
            self._messages.append(Message(role="user", content=text,
                                          attachments=m.attachments))
        elif t is AssistantMessage:
            e: Any = event
            if calls is None:
                calls = e.tool_calls
            self._messages.append(
                Message(role="assistant", content=e.text, tool_calls=calls,
                        reasoning=e.reasoning)
            )
            for call in calls:
                self.pending[call.id] = call
            self.answers += 1
            u = e.usage
            if u.input_tokens:
                self.last_usage = (len(self._messages), u.input_tokens + u.output_tokens)
        elif t is ToolReturned:
            r: Any = event
            self.pending.pop(r.call_id, None)
            self._messages.append(
                Message(
                    role="tool",
                    content=r.output,
                    tool_call_id=r.call_id,
                    name=r.name,
                    is_error=r.status != "ok",
                )
            )
        elif t is ContextInjected:
            c: Any = event
            self._messages.append(Message(role="user", content=context_message(c.text, c.source)))
        elif t is StepStarted:
            self.step = event.step  # type: ignore[attr-defined]
            self.step_open = True
        elif t is StepEnded:
            self.step_open = False
        elif t is TurnStarted:
            s: Any = event
            self.turn = s.turn
            self.turn_open = True
            self.step_open = False
            if s.system is not None:
                self.system = s.system
            if s.tools is not None:
                self.tools = s.tools
            if s.model is not None:
                self.model = s.model
            if s.options is not None:
                self.options = freeze(s.options)  # read-only (C3); O(1) when it already is
            if s.cwd is not None:
                self.cwd = s.cwd
        elif t is TurnEnded:
            self.turn_open = False
            self.step_open = False
        elif t is ContextCompacted:
            c2: Any = event
            self.compact(c2.start, c2.end, c2.messages, _LEDGER)
        elif t is PluginEvent:
            self.index_plugin_event(event, _LEDGER)  # type: ignore[arg-type]

    def index_plugin_event(self, event: PluginEvent, _key: object = None) -> None:
        """Keep a plugin event for :func:`dsh.ledger.plugin_events.read`: O(1), no message.
        Sealed like :meth:`apply`: the state folded from the index is the ledger's."""
        if self._sealed and _key is not _LEDGER:
            raise _read_only("index_plugin_event")
        self._index(event.plugin, event.name, event)

    def _index(self, plugin: str, name: str, item: Any) -> None:
        index = self.plugin_index
        if index is None:
            index = self.plugin_index = {}
        for key in (plugin, (plugin, name)):
            events = index.get(key)
            if events is None:
                events = index[key] = EventList()
            events.append(item)

    def compact(self, start: int, end: int, replacement: tuple[Message, ...],
                _key: object = None) -> None:
        """Apply a ``context/compacted`` event: ``[start, end)`` becomes ``replacement``.

        A new list, so views taken before (a request in flight, a frozen read) keep the
        history they were taken from; O(n) once per compaction, the steps stay O(1).
        """
        if self._sealed and _key is not _LEDGER:
            raise _read_only("compact")
        items = self._messages
        if not 0 <= start <= end <= len(items):
            from dsh.core.errors import LedgerError

            raise LedgerError(f"context/compacted: range [{start}, {end}) outside the "
                              f"{len(items)} projected messages")
        self._messages = items[:start] + list(replacement) + items[end:]
        self.last_usage = None
        self.compactions += 1

    def apply_raw(self, d: dict[str, Any], _key: object = None, line: str | None = None) -> None:
        """:meth:`apply` for a decoded ledger line, without building the event; ``line``, the
        line's text, if the caller has it (a plugin event then keeps that, not ``d``).

        Resuming a 100,000-event session spends most of its time building event objects
        that the projection reads a few fields of and drops; this reads those fields straight
        from the JSON object, checking each one's type. Any surprise raises
        :class:`~dsh.ledger.serialize.InvalidLine` and the caller falls back to full event loading,
        which explains exactly what is wrong. tests/test_history.py checks, over generated
        sessions, that both paths project the same thing.
        """
        if self._sealed and _key is not _LEDGER:
            raise _read_only("apply_raw")
        tag = d["type"]
        fold = FOLDS.get(tag) if type(tag) is str else None
        if fold is not None:  # a step's lines: checked and folded in one pass (dsh.ledger.folds)
            seq = d["seq"]
            if type(seq) is not int:
                checked(seq, int)
            if fold(self, d):
                self.seq = seq
                return
        check_raw(d)  # what `dsh sessions show` refuses, resuming refuses too
        seq = d["seq"]
        if type(seq) is not int:
            checked(seq, int)
        if tag == "user/message":
            text = checked(d["text"], str)
            if "fragments" in d:
                text = _expand(self.blobs, raw_fragments(d["fragments"]), text)
            self._messages.append(Message(role="user", content=text,
                                          attachments=raw_attachments(d.get("attachments", ()))))
        elif tag == "assistant/message":
            calls = raw_tool_calls(d.get("tool_calls", []))
            self._messages.append(Message(role="assistant", content=checked(d.get("text", ""), str),
                                          tool_calls=calls,
                                          reasoning=raw_reasoning(d.get("reasoning", ()))))
            for call in calls:
                self.pending[call.id] = call
            self.answers += 1
            u = d.get("usage")
            if u:
                i = checked(u.get("input_tokens", 0), int)
                o = checked(u.get("output_tokens", 0), int)
                if i:
                    self.last_usage = (len(self._messages), i + o)
        elif tag == "tool/result":
            call_id = checked(d["call_id"], str)
            self.pending.pop(call_id, None)
            self._messages.append(Message(
                role="tool", content=checked(d.get("output", ""), str), tool_call_id=call_id,
                name=checked(d["name"], str), is_error=checked(d.get("status", "ok"), str) != "ok",
            ))
        elif tag == "context/injected":
            self._messages.append(Message(role="user", content=context_message(
                checked(d["text"], str), checked(d.get("source", "api"), str))))
        elif tag == "step/start":
            checked(d["turn"], int)
            self.step = checked(d["step"], int)
            self.step_open = True
        elif tag == "step/end":
            self.step_open = False
        elif tag == "turn/start":
            self.turn = checked(d["turn"], int)
            checked(d["agent"], str)
            self.turn_open = True
            self.step_open = False
            system = d.get("system")
            if system is not None:
                self.system = checked(system, str)
            tools = raw_tools(d.get("tools"))
            if tools is not None:
                self.tools = tools
            model = d.get("model")
            if model is not None:
                self.model = checked(model, str)
            options = d.get("options")
            if options is not None:
                self.options = freeze(checked(options, dict))
            cwd = d.get("cwd")
            if cwd is not None:
                self.cwd = checked(cwd, str)
        elif tag == "turn/end":
            self.turn_open = False
            self.step_open = False
        elif tag == "context/compacted":
            self.compact(checked(d["start"], int), checked(d["end"], int),
                         raw_messages(d.get("messages", [])), _LEDGER)
        elif tag[:2] == "x/":
            # Checked now (a bad line fails the load, as any other would); built into a
            # PluginEvent — its data frozen — when first read: resuming a session with many
            # recorded-state updates reads one of them (benchmarks/resume.py).
            plugin, name = checked_raw(d, line)
            self._index(plugin, name, _Unread(d if line is None else line))
        self.seq = seq


def _expand(blobs: Any, refs: Any, text: str) -> str:
    """A user message's text after its fragment blocks, read from ``blobs``."""
    from dsh.ledger.fragments import expand

    return expand(blobs, refs, text)


class _Unread:
    """A plugin event's line, checked when the ledger was loaded, not yet built into its
    :class:`~dsh.ledger.events.PluginEvent` (shared by its two index lists: built once).

    ``line`` is the line's text as read (decoded again at the first read) or, for a line
    folded without its text, the decoded object. The text, because the cyclic collector never
    walks a ``str``: 10,000 task lists kept decoded were 20,000 dicts and 10,000 lists more
    for each of its passes after a load, most of the cost of resuming them."""

    __slots__ = ("line", "event")

    def __init__(self, line: str | dict[str, Any]) -> None:
        self.line: str | dict[str, Any] | None = line
        self.event: PluginEvent | None = None

    def built(self) -> PluginEvent:
        event = self.event
        if event is None:
            with _BUILDING:  # two threads reading it at once get one and the same event
                event = self.event
                if event is None:
                    line = self.line
                    # the same text through the same decoder: the object checked at load
                    d = json.loads(line) if type(line) is str else line
                    event = self.event = from_checked(d)  # type: ignore[arg-type]
                    self.line = None
        return event


_BUILDING = threading.Lock()


def _built(item: Any) -> PluginEvent:
    return item.built() if type(item) is _Unread else item


class EventList(list):
    """One list of :attr:`Projection.plugin_index`: a plugin's events, oldest first, as
    :class:`~dsh.ledger.events.PluginEvent` objects. Appended to by the projection only. The
    events of a loaded ledger are checked at load and built at their first read (indexing,
    iterating, comparing, searching, copying): a session of 10,000 recorded-state updates
    builds the one its state key folds, not 10,000."""

    __slots__ = ()

    def _all(self) -> EventList:
        for i, item in enumerate(list.__iter__(self)):
            if type(item) is _Unread:
                list.__setitem__(self, i, item.built())
        return self

    @overload
    def __getitem__(self, index: SupportsIndex) -> PluginEvent: ...

    @overload
    def __getitem__(self, index: slice) -> list[PluginEvent]: ...

    def __getitem__(self, index: Any) -> Any:
        if type(index) is slice:
            return [_built(x) for x in list.__getitem__(self, index)]
        i = operator.index(index)
        if i < 0:  # counted once: the projection may append meanwhile (another thread)
            i += len(self)
            if i < 0:
                raise IndexError("list index out of range")
        item = list.__getitem__(self, i)
        if type(item) is _Unread:
            item = item.built()
            list.__setitem__(self, i, item)
        return item

    def __iter__(self) -> Iterator[PluginEvent]:
        for i, item in enumerate(list.__iter__(self)):
            if type(item) is _Unread:
                item = item.built()
                list.__setitem__(self, i, item)
            yield item

    def __reversed__(self) -> Iterator[PluginEvent]:
        for i in range(len(self) - 1, -1, -1):
            yield self[i]

    def __repr__(self) -> str:
        return list.__repr__(self._all())

    def __eq__(self, other: object) -> bool:
        return list.__eq__(self._all(), other._all() if type(other) is EventList else other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None

    def __contains__(self, value: object) -> bool:
        return list.__contains__(self._all(), value)

    def index(self, value: Any, *args: Any) -> int:
        return list.index(self._all(), value, *args)

    def count(self, value: Any) -> int:
        return list.count(self._all(), value)

    def copy(self) -> list[PluginEvent]:
        return list(self)

    def __add__(self, other: Any) -> list[PluginEvent]:  # type: ignore[override]
        return list(self) + list(other)

    def __radd__(self, other: Any) -> list[PluginEvent]:  # ``[…] + events``
        return list(other) + list(self)

    def pop(self, index: SupportsIndex = -1) -> PluginEvent:
        return _built(list.pop(self, index))

    def __mul__(self, n: SupportsIndex) -> list[PluginEvent]:
        return list(self) * n

    def __rmul__(self, n: SupportsIndex) -> list[PluginEvent]:
        return list(self) * n

    def __reduce__(self) -> Any:
        return (EventList, (list(self),))


def derive_messages(events: Iterable[Event]) -> MessageView:
    """The model history that ``events`` (a whole session's ledger, in order) project to."""
    p = Projection()
    for event in events:
        p.apply(event)
    return p.view()


def render_history(messages: Iterable[Message]) -> str:
    """A plain-text transcript of ``messages``, for handing a frozen read of one session's
    history to another (``App.parallel``)."""
    lines = []
    for m in messages:
        if m.role == "tool":
            lines.append(f"[tool {m.name} result{' (error)' if m.is_error else ''}] {m.content}")
            continue
        text = m.content
        for call in m.tool_calls:
            text += f"\n[calls {call.name}({json.dumps(call.arguments, ensure_ascii=False)})]"
        lines.append(f"[{m.role}] {text.strip()}")
    return "\n".join(lines)

