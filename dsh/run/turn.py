"""The state of one turn: the inbox every input enters by, what ``pre_step`` sees of a step,
and the :class:`Turn` handed to ``run_turn`` and ``turn_stopping`` (MISSION B2, B3).

The turn driver that uses them is :mod:`dsh.run.loop`; these are plain data and a
thread-safe queue, importable without it (``dsh.run.app`` builds an :class:`Inbox` per
session and a :class:`Turn` per message).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.core.messages import Attachment
from dsh.core.messages import Message

if TYPE_CHECKING:
    from dsh.core.messages import ModelResponse
    from dsh.host.runcontext import RunContext
    from dsh.host.scope import AgentHandle
    from dsh.ledger.store import Ledger
    from dsh.run.app import Agent
    from dsh.run.app import Session


@attrs.frozen
class InboxItem:
    """One input waiting in the inbox: a user message or injected context."""

    #: The text of the message or context item.
    text: str
    #: ``user`` wakes the loop; ``context`` waits for the next user message.
    kind: str = "user"
    #: Where it came from: ``user``, ``api``, ``plugin:NAME``, ``fork:SESSION``, …
    source: str = "user"
    #: A user message's attachments, already stored (references, issue 17).
    attachments: tuple[Attachment, ...] = ()


class Inbox:
    """Every input enters here first (B3). A user message wakes the loop; injected context
    waits until a user message arrives, and is then consumed with it.

    Thread-safe: any thread may put or inject while a turn runs (steering, ``Session.steer``);
    the running turn takes what arrived at its step boundaries. Text that is empty or only
    whitespace (what ``str.strip()`` removes) is no message and is not queued. Every
    operation is O(1) but :meth:`take`, which is O(items it returns).
    """

    def __init__(self) -> None:
        self._items: deque[InboxItem] = deque()
        self._messages = 0  # user messages waiting: ``awake`` without a scan
        self._lock = threading.Lock()
        self._taking = False  # a running turn takes messages at its step boundaries
        self._taken: list[InboxItem] = []  # taken, not yet recorded: see restore()
        self._returned: set[int] = set()  # ids of items put back by a turn that failed

    def put(self, text: str, source: str = "user",
            attachments: tuple[Attachment, ...] = ()) -> bool:
        """Queue a user message. Returns True when a running turn will take it at its next
        step boundary, False when it waits for the next turn (or, blank, was not queued).
        A message with attachments is a message even when its text is blank."""
        if not text.strip() and not attachments:
            return False
        with self._lock:
            self._items.append(InboxItem(text, "user", source, tuple(attachments)))
            self._messages += 1
            return self._taking

    def inject(self, text: str, source: str = "api") -> None:
        with self._lock:
            self._items.append(InboxItem(text, "context", source))

    @property
    def awake(self) -> bool:
        """True when a user message is waiting (injected context alone never wakes it)."""
        return self._messages > 0

    @property
    def messages(self) -> int:
        """How many user messages are waiting."""
        return self._messages

    def open(self) -> None:
        """A turn is running: messages put from now on are taken at its step boundaries."""
        with self._lock:
            self._taking = True

    def close(self) -> None:
        """No turn is taking messages: from now on they wait for the next one."""
        with self._lock:
            self._taking = False

    def take(self, close: bool = False) -> tuple[list[InboxItem], InboxItem | None]:
        """Everything up to and including the first user message: ``(context, message)``.

        With no user message waiting it returns ``([], None)`` and the context stays; with
        ``close`` it then also stops taking (:meth:`close`) in the same critical section, so a
        message put concurrently is either returned here or waits for the next turn, never
        promised to this one and left behind.
        """
        with self._lock:
            if not self._messages:
                if close:
                    self._taking = False
                return [], None
            context: list[InboxItem] = []
            item = self._items.popleft()
            while item.kind != "user":
                context.append(item)
                item = self._items.popleft()
            self._messages -= 1
            self._taken.extend(context)
            self._taken.append(item)
            return context, item

    def withdraw(self) -> list[InboxItem]:
        """Remove and return the user messages waiting, in order (context stays)."""
        with self._lock:
            taken = [i for i in self._items if i.kind == "user"]
            self._items = deque(i for i in self._items if i.kind != "user")
            self._messages = 0
            return taken

    def commit(self) -> None:
        """What was taken is recorded now (``user/message``, ``step/rejected``, …)."""
        with self._lock:
            self._taken.clear()

    def restore(self) -> None:
        """Put back, in front and in order, what was taken since the last :meth:`commit`: a
        turn that ends before recording its input (a limit, a stop, an error) loses nothing;
        the input waits for the next turn."""
        with self._lock:
            for item in reversed(self._taken):
                self._returned.add(id(item))
                self._items.appendleft(item)
                if item.kind == "user":
                    self._messages += 1
            self._taken.clear()

    def newest(self) -> InboxItem | None:
        """The item put last (a turn's own message, just after :meth:`put`)."""
        with self._lock:
            return self._items[-1] if self._items else None

    def mark_returned(self, item: InboxItem) -> None:
        """``item``, still waiting, belongs to a turn that failed before taking it: its
        outcome reports it, so :meth:`drain` counts it as returned, not as never taken."""
        with self._lock:
            if any(i is item for i in self._items):
                self._returned.add(id(item))

    def requeue(self, context: list[InboxItem]) -> None:
        """Put injected context back in front, in order (a step that was rejected)."""
        with self._lock:
            self._items.extendleft(reversed([i for i in context if i.kind == "context"]))

    def drain(self) -> tuple[list[InboxItem], list[InboxItem]]:
        """Remove everything waiting (a closing session reports it): ``(never taken, put
        back by a turn that failed — whose outcome already told the caller)``."""
        with self._lock:
            fresh = [i for i in self._items if id(i) not in self._returned]
            returned = [i for i in self._items if id(i) in self._returned]
            self._items.clear()
            self._returned.clear()
            self._messages = 0
            return fresh, returned

    def __len__(self) -> int:
        return len(self._items)


@attrs.define(eq=False)
class StepDraft:
    """What ``pre_step`` sees and may change before anything of the step is logged."""

    #: The step's number in the turn, from 0.
    index: int
    #: The agent's name (a string, as before issue 11; ``handle`` has the rest).
    agent: str
    #: The user message the step will send (``""`` on a step that only carries tool
    #: results); rewrite it here, and the rewrite is what is recorded.
    text: str
    #: Injected context items recorded before the message (``context/injected``); add or
    #: remove items here.
    context: list[InboxItem]
    #: The history so far (the ledger's projection; a read-only view).
    messages: Sequence[Message]
    #: Who wrote the message: ``user``, or ``plugin:NAME`` for a ``turn_stopping`` follow-up
    #: (``pre_step`` also runs for those).
    source: str = "user"
    #: The reason given to :meth:`reject`, once the step is refused.
    rejected: str | None = None
    #: The registered name of the plugin whose ``pre_step`` rejected the step or emptied its
    #: message, set by the loop (never by the plugin itself).
    rejected_by: str | None = None
    #: The turn this step belongs to (``turn.agent``, ``turn.number``, ``turn.ctx``), so a
    #: plugin reaches the agent's settings (``turn.agent.info.plugin_settings(NAME)``).
    turn: Turn | None = attrs.field(default=None, repr=False)
    #: The message's attachments (references to stored bytes, issue 17); recorded with it.
    #: A plugin may remove some; emptying ``text`` drops them with it (a rejection).
    attachments: tuple[Attachment, ...] = ()

    @property
    def handle(self) -> AgentHandle:
        """The :class:`dsh.AgentHandle` of the agent: settings, stashes, plugin events."""
        if self.turn is None:
            raise AttributeError("this StepDraft was built outside a turn: it has no handle")
        return self.turn.agent.info

    def reject(self, reason: str, plugin: str | None = None) -> None:
        """Refuse the step with ``reason``. The loop records which plugin called this from
        its registration; ``plugin`` is ignored (accepted for compatibility)."""
        self.rejected = str(reason) if reason else "rejected"

    @property
    def has_input(self) -> bool:
        """True when the step carries a message: text that is not empty or whitespace."""
        return bool(self.text.strip())


@attrs.define(eq=False)
class Turn:
    """The state of one turn, handed to ``run_turn`` and ``turn_stopping``."""

    #: The turn's number in the session, from 1.
    number: int
    #: The assembled :class:`dsh.run.app.Agent` (``handle`` is what plugins need of it).
    agent: Agent
    #: The session's ledger (append-only; ``ledger.projection`` is the history).
    ledger: Ledger
    #: Where input waits (user messages, injected context).
    inbox: Inbox
    #: The run's :class:`dsh.RunContext`.
    ctx: RunContext
    #: The step limit of the turn (``max_steps``).
    max_steps: int
    #: How many ``turn_stopping`` follow-ups the turn takes at most.
    max_continuations: int = 3
    #: How many steps have run (0 when the turn's input was empty).
    steps: int = 0
    #: How many ``turn_stopping`` follow-ups have been taken.
    continuations: int = 0
    #: The text of the latest model answer (the run's output).
    output: str = ""
    #: Why the turn ended, recorded on ``turn/end`` (set by whoever ends it).
    reason: str = ""
    #: Receives text deltas as they stream (None when nobody watches).
    on_text: Any = None
    #: Receives reasoning deltas as they stream (``llm/reasoning``); None when unobserved.
    on_reasoning: Any = None
    #: The :class:`dsh.run.app.Session` the turn runs in (None for a turn built by hand).
    session: Session | None = attrs.field(default=None, repr=False)
    #: The latest step's final :class:`dsh.core.messages.ModelResponse` (text, tool calls, usage,
    #: reasoning); None while no step has run.
    response: ModelResponse | None = attrs.field(default=None, repr=False)
    #: How many times ``turn_stopping`` has been called in this turn, this call included.
    stopping_calls: int = 0
    # The text deltas the current model call has streamed so far (dsh.run.loop): recorded as
    # the step's answer (``stop_reason`` ``interrupted``) when the call is aborted mid-stream.
    _partial: list[str] = attrs.field(factory=list, repr=False, init=False)

    @property
    def pm(self) -> Any:
        """The agent's plugin manager."""
        return self.agent.pm

    @property
    def handle(self) -> AgentHandle:
        """The :class:`dsh.AgentHandle` of the agent: settings, stashes, plugin events."""
        return self.agent.info
