"""Persistent events: the lines of the session ledger (MISSION C1, docs/events.md).

Each class is frozen and carries a stable ``type`` tag (``"turn/start"``), never derived from
its Python name, so renaming a class never breaks an old ledger. Every line also carries the
schema version ``v``, the session-wide sequence number ``seq``, an ISO-8601 UTC timestamp
``ts`` and the ``session`` id. Fields this version does not know (written by a newer dsh)
are kept in ``extra`` and written back unchanged.
"""

from __future__ import annotations

from typing import Any
from typing import ClassVar

import attrs

from dsh.core.messages import Attachment
from dsh.core.messages import Change
from dsh.core.messages import FragmentRef
from dsh.core.messages import Message
from dsh.core.messages import Reasoning
from dsh.core.messages import ToolCall
from dsh.core.messages import ToolSpec
from dsh.core.messages import Usage
from dsh.core.messages import freeze

SCHEMA_VERSION = 1

OUTCOMES = ("completed", "rejected", "stopped", "aborted", "budget", "error")


@attrs.frozen(kw_only=True, repr=False)
class Event:
    """Base of persistent events.

    Subclasses are declared with ``repr=False`` and share :meth:`__repr__` below: attrs
    would otherwise generate (and compile) one per class at import, which is start-up time.
    """

    type: ClassVar[str] = ""
    seq: int = 0
    ts: str = ""
    session: str = ""
    #: Unknown fields read from a newer schema, preserved on a round trip.
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False, hash=False, repr=False)

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}"
                           for f in attrs.fields(type(self)) if f.repr)
        return f"{type(self).__name__}({fields})"


@attrs.frozen(kw_only=True, repr=False)
class TurnStarted(Event):
    """A turn opened. ``system``, ``tools``, ``model`` and ``options`` are what this turn's
    requests use; each is ``None`` when unchanged since the previous turn of the session."""

    type: ClassVar[str] = "turn/start"
    turn: int
    agent: str
    model: str | None = None
    system: str | None = None
    tools: tuple[ToolSpec, ...] | None = None
    options: dict[str, Any] | None = attrs.field(default=None, hash=False)
    #: For a nested run (a sub-agent): the parent's session and the tool call that started it.
    parent: str | None = None
    parent_call: str | None = None
    #: On a turn that switches the model: how many reasoning parts of the history the new
    #: model will not receive (another provider family wrote them; issue 17). 0 otherwise.
    reasoning_withheld: int = 0
    #: The trust decisions in force when the turn started (project files approved by content,
    #: or inert: ``{"path", "kind", "sha256", "decision"}``); ``None`` when unchanged since
    #: the previous turn of the session.
    trust: tuple[dict[str, Any], ...] | None = attrs.field(default=None, hash=False)
    #: The permission mode of the turn's tool calls (``ask``, ``auto-edit``…); ``None`` when
    #: unchanged since the previous turn of the session.
    mode: str | None = None
    #: The working directory of the process that ran the turn (``dsh run -c`` continues the
    #: latest session of the current directory); ``None`` when unchanged since the previous
    #: turn of the session. Never part of a model request.
    cwd: str | None = None


@attrs.frozen(kw_only=True, repr=False)
class StepStarted(Event):
    type: ClassVar[str] = "step/start"
    turn: int
    step: int


@attrs.frozen(kw_only=True, repr=False)
class UserMessage(Event):
    """A user message; ``source`` is ``user``, or the plugin that continued the turn."""

    type: ClassVar[str] = "user/message"
    text: str
    source: str = "user"
    #: Files sent with the message: references by content hash (issue 17).
    attachments: tuple[Attachment, ...] = ()
    #: Text fragments sent before ``text`` (``dsh run -f``), each a ``<fragment>`` block:
    #: references by content hash, the text stored once beside the ledger.
    fragments: tuple[FragmentRef, ...] = ()


@attrs.frozen(kw_only=True, repr=False)
class ContextInjected(Event):
    """Injected context, written when a turn consumes it (before that turn's user message)."""

    type: ClassVar[str] = "context/injected"
    text: str
    source: str = "api"


@attrs.frozen(kw_only=True, repr=False)
class AssistantMessage(Event):
    type: ClassVar[str] = "assistant/message"
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = Usage()
    tool_call_source: str | None = None
    model: str | None = None
    stop_reason: str | None = None
    #: Reasoning parts, replayed to the provider family that wrote them (issue 17).
    reasoning: tuple[Reasoning, ...] = ()


@attrs.frozen(kw_only=True, repr=False)
class ToolCalled(Event):
    type: ClassVar[str] = "tool/call"
    call_id: str
    name: str
    arguments: dict[str, Any] = attrs.field(factory=dict, hash=False)
    #: For a sub-agent tool: the child session it runs in.
    child_session: str | None = None


@attrs.frozen(kw_only=True, repr=False)
class ToolReturned(Event):
    """A tool's result. ``status`` is ``ok``, ``error``, ``budget`` (not run: no tool call
    left in the budget chain) or ``interrupted`` (the run ended before the tool returned;
    written on resume)."""

    type: ClassVar[str] = "tool/result"
    call_id: str
    name: str
    status: str = "ok"
    output: str = ""
    duration_ms: float | None = None
    #: The files the call changed, each with its unified diff (written only when there are
    #: any): what rewind, replay and every view of the session use, never a re-read of disk.
    changes: tuple[Change, ...] = ()


@attrs.frozen(kw_only=True, repr=False)
class StepRejected(Event):
    """``pre_step`` refused the step (B4): the step was attempted but did not run."""

    type: ClassVar[str] = "step/rejected"
    turn: int
    step: int
    reason: str = ""
    plugin: str | None = None
    text: str = ""


@attrs.frozen(kw_only=True, repr=False)
class StepEnded(Event):
    type: ClassVar[str] = "step/end"
    turn: int
    step: int


@attrs.frozen(kw_only=True, repr=False)
class TurnEnded(Event):
    """A turn closed with one of :data:`OUTCOMES` and a human-readable reason."""

    type: ClassVar[str] = "turn/end"
    turn: int
    outcome: str
    reason: str = ""


@attrs.frozen(kw_only=True, repr=False)
class ContextCompacted(Event):
    """The model's history was compacted (issue 10): the projected messages
    ``[start, end)`` are replaced by ``messages`` from here on. The replaced events stay in
    the ledger; ``strategy`` and ``plugin`` say what made the replacement, ``reason`` why
    (``threshold``, ``provider``, ``manual``), ``tokens_before``/``tokens_after`` the
    estimated size of the next request, ``summary_session`` the sub-run that wrote a summary."""

    type: ClassVar[str] = "context/compacted"
    start: int
    end: int
    messages: tuple[Message, ...] = ()
    strategy: str = ""
    plugin: str | None = None
    reason: str = ""
    tokens_before: int = 0
    tokens_after: int = 0
    summary_session: str | None = None


@attrs.frozen(kw_only=True, repr=False)
class SessionForked(Event):
    """The session began as a copy of another session's history (``dsh sessions fork``,
    ``rewind``, ``/fork``): the first line of a fork. The lines after it are the parent's
    lines up to the end of its turn ``turn`` (0: none), ``session`` and ``seq`` renumbered;
    ``parent_seq`` is the parent's last line copied. The fork does not need its parent:
    deleting the parent later loses nothing here. ``reason`` is ``fork`` or ``rewind``."""

    type: ClassVar[str] = "session/fork"
    parent: str
    turn: int = 0
    parent_seq: int = -1
    reason: str = "fork"


@attrs.frozen(kw_only=True, repr=False)
class UnknownEvent(Event):
    """A line whose ``type`` this version does not know (a newer dsh, or a plugin that is no
    longer installed). Kept verbatim in ``extra`` and written back unchanged."""

    type: ClassVar[str] = "unknown"
    tag: str = ""


@attrs.frozen(kw_only=True, repr=False)
class PluginEvent(Event):
    """A plugin's own persistent event (issue 11), tagged ``x/PLUGIN/NAME`` — a family, not
    one tag, so it is not in :data:`EVENT_TYPES`. ``data`` is a JSON object (read-only once
    built), ``version`` the plugin's own schema version of it. Written with
    :func:`dsh.ledger.plugin_events.record_event`; ignored by the projection into model messages."""

    type: ClassVar[str] = "x"  # the family; an instance's ``tag`` is ``x/PLUGIN/NAME``
    plugin: str
    name: str
    data: dict[str, Any] = attrs.field(factory=dict, hash=False, converter=freeze)
    version: int = 1

    @property
    def tag(self) -> str:
        """The line's ``type``: ``x/PLUGIN/NAME``."""
        return f"x/{self.plugin}/{self.name}"


EVENT_TYPES: tuple[type[Event], ...] = (
    TurnStarted,
    StepStarted,
    UserMessage,
    ContextInjected,
    AssistantMessage,
    ToolCalled,
    ToolReturned,
    StepRejected,
    StepEnded,
    TurnEnded,
    ContextCompacted,
    SessionForked,
)


# --------------------------------------------------------------------- content and metadata

#: A field that carries **content**: text a person, a model, a tool, a project file or a plugin
#: wrote — messages, tool arguments and outputs, the system prompt and tool descriptions,
#: reasoning, reasons that quote errors, plugin data. An exporter sends it only when the
#: person asked for content (dsh-otel: ``capture_content = true``), redacted.
CONTENT = "content"
#: A field that carries **metadata**: ids, sequence numbers, times, counts, token usage,
#: durations, statuses and outcomes, and names from dsh's own configuration (agents, models,
#: plugins, strategies). An exporter may always send it.
METADATA = "metadata"
#: A tool name the *model* chose (``tool/call``, ``tool/result``): metadata when it names a
#: tool registered for the turn (the ``tools`` of the session's latest ``turn/start``),
#: content otherwise — an unregistered name is the model's own text (20 KB of it, a secret).
#: Without content, an exporter shows :data:`UNKNOWN_TOOL` in its place.
TOOL_NAME = "tool-name"
#: What an exporter shows instead of a model-chosen tool name that is not a registered tool.
UNKNOWN_TOOL = "unknown"

_BASE = {"seq": METADATA, "ts": METADATA, "session": METADATA,
         # fields of a newer schema: nobody here knows what they hold
         "extra": CONTENT}

#: Every field of every event, marked :data:`CONTENT`, :data:`METADATA` or
#: :data:`TOOL_NAME`: the one declaration every exporter of events honours (dsh-otel's spans;
#: ``tests/test_content_metadata.py`` checks that no field is left out).
FIELD_KINDS: dict[type[Event], dict[str, str]] = {
    TurnStarted: {**_BASE, "turn": METADATA, "agent": METADATA, "model": METADATA,
                  "system": CONTENT,
                  # names, descriptions and schemas (from MCP servers, project files); the
                  # names alone are the registry TOOL_NAME fields are checked against
                  "tools": CONTENT,
                  "options": CONTENT, "parent": METADATA, "parent_call": METADATA,
                  "reasoning_withheld": METADATA,
                  # paths of workspace files, which a model can name
                  "trust": CONTENT,
                  "mode": METADATA,
                  # a user's path (it names their home, their projects)
                  "cwd": CONTENT},
    StepStarted: {**_BASE, "turn": METADATA, "step": METADATA},
    UserMessage: {**_BASE, "text": CONTENT, "source": METADATA, "attachments": CONTENT,
                  # names are paths and URLs
                  "fragments": CONTENT},
    ContextInjected: {**_BASE, "text": CONTENT, "source": METADATA},
    AssistantMessage: {**_BASE, "text": CONTENT, "tool_calls": CONTENT, "usage": METADATA,
                       "tool_call_source": METADATA, "model": METADATA,
                       "stop_reason": METADATA, "reasoning": CONTENT},
    ToolCalled: {**_BASE, "call_id": METADATA, "name": TOOL_NAME, "arguments": CONTENT,
                 "child_session": METADATA},
    ToolReturned: {**_BASE, "call_id": METADATA, "name": TOOL_NAME, "status": METADATA,
                   "output": CONTENT, "duration_ms": METADATA,
                   # paths and diffs of workspace files (exporters send only their counts)
                   "changes": CONTENT},
    StepRejected: {**_BASE, "turn": METADATA, "step": METADATA, "reason": CONTENT,
                   "plugin": METADATA, "text": CONTENT},
    StepEnded: {**_BASE, "turn": METADATA, "step": METADATA},
    # ``reason`` may quote an error's text (a provider's, a tool's, a plugin's)
    TurnEnded: {**_BASE, "turn": METADATA, "outcome": METADATA, "reason": CONTENT},
    ContextCompacted: {**_BASE, "start": METADATA, "end": METADATA, "messages": CONTENT,
                       "strategy": METADATA, "plugin": METADATA, "reason": METADATA,
                       "tokens_before": METADATA, "tokens_after": METADATA,
                       "summary_session": METADATA},
    SessionForked: {**_BASE, "parent": METADATA, "turn": METADATA, "parent_seq": METADATA,
                    "reason": METADATA},
    UnknownEvent: {**_BASE, "tag": METADATA},
    PluginEvent: {**_BASE, "plugin": METADATA, "name": METADATA, "data": CONTENT,
                  "version": METADATA},
}


def field_kind(cls: type[Event], name: str) -> str:
    """:data:`CONTENT`, :data:`METADATA` or :data:`TOOL_NAME` for field ``name`` of event
    class ``cls``; a field nobody declared (a subclass's own) is content."""
    for klass in cls.__mro__:
        kinds = FIELD_KINDS.get(klass)  # type: ignore[call-overload]
        if kinds is not None and name in kinds:
            return kinds[name]
    return CONTENT


def tool_name(name: str, registered: frozenset[str] | set[str]) -> str:
    """A model-chosen tool name as metadata: ``name`` when it is a registered tool, else
    :data:`UNKNOWN_TOOL`."""
    return name if name in registered else UNKNOWN_TOOL


def metadata(event: Event, registered: frozenset[str] | set[str] = frozenset()
             ) -> dict[str, Any]:
    """The metadata fields of ``event`` by name (``extra`` and every content field left out;
    a :data:`TOOL_NAME` field shown through :func:`tool_name`)."""
    out: dict[str, Any] = {}
    for f in attrs.fields(type(event)):
        kind = field_kind(type(event), f.name)
        if kind == METADATA:
            out[f.name] = getattr(event, f.name)
        elif kind == TOOL_NAME:
            out[f.name] = tool_name(getattr(event, f.name), registered)
    return out
