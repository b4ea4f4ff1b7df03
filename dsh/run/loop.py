"""The agent loop (MISSION A1, B1–B4) as the built-in ``run_turn`` implementation.

One turn, in order (docs/architecture.md, "The flow of one message")::

    turn/start → take input from the inbox → pre_step (agent/pre-step) → step/start
    → context/injected* → user/message → request (agent/request, llm/stream)
    → assistant/message → [tool/call* → execute → tool/result*] → step/end
    → more work due? another step : turn_stopping → turn/end (written by the caller)

The model's history for each step is the ledger's projection, never a list kept on the side.
"""

from __future__ import annotations

import contextvars
import threading
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.core.errors import BudgetExceeded
from dsh.core.errors import PluginError
from dsh.core.messages import Attachment
from dsh.core.messages import Message
from dsh.core.messages import ModelRequest
from dsh.core.messages import ToolCall
from dsh.core.messages import thaw
from dsh.core.redact import redact
from dsh.hookspecs import hookimpl
from dsh.host.manager import call_impl
from dsh.host.runcontext import RunContext
from dsh.ledger.events import AssistantMessage
from dsh.ledger.events import ContextInjected
from dsh.ledger.events import StepEnded
from dsh.ledger.events import StepRejected
from dsh.ledger.events import StepStarted
from dsh.ledger.events import ToolCalled
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import UserMessage
from dsh.ledger.store import new_session_id
from dsh.llm.builtin import ModelCall
from dsh.run.budget import reserved_call
from dsh.run.recorder import emit
from dsh.tools.registry import ToolInvocation
from dsh.tools.registry import ToolOutcome

if TYPE_CHECKING:
    from dsh.core.messages import ModelResponse
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

    @property
    def pm(self) -> Any:
        """The agent's plugin manager."""
        return self.agent.pm

    @property
    def handle(self) -> AgentHandle:
        """The :class:`dsh.AgentHandle` of the agent: settings, stashes, plugin events."""
        return self.agent.info


@hookimpl(trylast=True)
def run_turn(turn: Turn) -> str:
    try:
        return _run_turn(turn)
    finally:
        turn.inbox.restore()  # input taken but never recorded waits for the next turn


def _run_turn(turn: Turn) -> str:
    ctx = turn.ctx
    ledger = turn.ledger
    agent = turn.agent
    observers = agent.pm.hook.observe_event
    context_items, message = turn.inbox.take()
    if message is None:
        # No input (B3): the message was empty or whitespace, and injected context alone
        # waits in the inbox for a real one. No step is attempted and nothing is sent.
        follow = stopping(turn)
        if follow is None:
            turn.reason = turn.reason or "no input: the message was empty"
            return "completed"
        context_items, message = follow
    text, source = message.text, message.source
    attachments: tuple[Attachment, ...] = message.attachments
    while True:
        ctx.cancel.check()
        if ctx.stop_requested:
            turn.reason = "stopped on request"
            return "stopped"
        if turn.steps >= turn.max_steps:
            turn.reason = f"step limit reached ({turn.max_steps} steps)"
            return "budget"
        exceeded = ctx.budget.exceeded()
        if exceeded:
            turn.reason = exceeded
            return "budget"

        draft = StepDraft(turn.steps, agent.name, text, list(context_items),
                          ledger.projection.view(), source, turn=turn,
                          attachments=attachments)
        emit("agent/pre-step", step=draft.index, text=draft.text)
        call_pre_step(agent.pm, draft)
        if draft.rejected is not None:
            reason = draft.rejected
            ledger.append(StepRejected, turn=turn.number, step=draft.index,
                          reason=redact(reason), plugin=draft.rejected_by, text=redact(text))
            turn.inbox.commit()
            # Nothing injected is lost (B4): the rejected step's context waits for the next one.
            turn.inbox.requeue(context_items)
            # A rejected turn closes like any other: turn_stopping may still follow up (B2).
            follow = stopping(turn)
            if follow is None:
                turn.reason = reason
                return "rejected"
            context_items, message = follow
            text, source, attachments = message.text, message.source, message.attachments
            continue

        refused = ctx.budget.reserve(steps=1)  # a step is counted before it starts (D8)
        if refused:
            turn.reason = refused
            return "budget"
        ledger.append(StepStarted, turn=turn.number, step=draft.index)
        for item in draft.context:
            ledger.append(ContextInjected, text=item.text, source=item.source)
        if draft.has_input or draft.attachments:
            ledger.append(UserMessage, text=draft.text, source=draft.source,
                          attachments=tuple(draft.attachments))
        turn.inbox.commit()
        context_items, text, source = [], "", "user"
        attachments = ()
        turn.steps += 1

        try:
            response = _request_fitting(turn)
        except BudgetExceeded as exc:  # the request could not reserve its place: not sent
            turn.reason = str(exc)
            return "budget"
        ledger.append(
            AssistantMessage, text=response.text, tool_calls=response.tool_calls,
            usage=response.usage, tool_call_source=response.tool_call_source,
            model=response.model or agent.model_id, stop_reason=response.stop_reason,
            reasoning=response.reasoning,
        )
        turn.output = response.text
        turn.response = response
        not_run = None
        if response.tool_calls:
            # Budgets are checked after each model call resolves (D8): a call that used up
            # the budget does not get its tools run; they are closed as interrupted.
            exceeded = ctx.budget.exceeded()
            if exceeded:
                turn.reason = exceeded
                return "budget"
            not_run = run_tools(turn, response.tool_calls)
        ledger.append(StepEnded, turn=turn.number, step=draft.index)
        ledger.step_boundary()
        if not_run:  # some calls of the step could not reserve: the budget is spent (D8)
            turn.reason = not_run
            return "budget"
        check_observers(ctx, observers)
        # Steering (B3): a message that arrived during the step is taken now, and goes with
        # the next step (with the tool results, if any are due).
        context_items, message = turn.inbox.take()
        if message is None and not response.tool_calls:
            follow = stopping(turn)
            if follow is None:
                return "completed"
            context_items, message = follow
        if message is not None:
            text, source = message.text, message.source
            attachments = message.attachments


def stopping(turn: Turn) -> tuple[list[InboxItem], InboxItem] | None:
    """No work is due and the turn is about to stop (B2): emit ``agent/turn-stopping`` and
    call ``turn_stopping``, every time. Returns the input of one more step, or None to stop.

    A follow-up message is taken while ``turn.continuations < turn.max_continuations``; past
    that the hook is still called, its answer is not taken, and ``turn.reason`` says so (it
    lands in ``turn/end``). Then, in one critical section with closing the inbox, a message
    that was steered in meanwhile still gets its step; one that comes later waits for the
    next turn.
    """
    emit("agent/turn-stopping", steps=turn.steps)
    turn.stopping_calls += 1
    follow = ask_to_continue(turn)
    if follow is not None and turn.continuations < turn.max_continuations:
        turn.continuations += 1
        return [], InboxItem(follow[0], "user", follow[1])
    context, message = turn.inbox.take(close=True)
    if message is not None:
        return context, message
    if follow is not None:
        turn.reason = (f"continuation limit reached ({turn.max_continuations}): the follow-up "
                       f"from {follow[1]} was not taken")
    return None


def ask_to_continue(turn: Turn) -> tuple[str, str] | None:
    """Call ``turn_stopping`` as a firstresult hook would, but keep the answering plugin's
    name, so the follow-up message records where it came from."""
    for impl in reversed(turn.agent.pm.hook.turn_stopping.get_hookimpls()):
        _not_wrapped(impl, "turn_stopping")
        follow = call_impl(impl, "turn_stopping", turn=turn)
        if follow:
            return str(follow), f"plugin:{impl.plugin_name}"
    return None


def call_pre_step(pm: Any, draft: StepDraft) -> None:
    """Call ``pre_step`` one implementation at a time, in pluggy's order, so the plugin that
    rejects the step, or rewrites its message to empty, is known from its registration (B4).

    The first rejection wins: later implementations are not called. A message rewritten to
    empty or whitespace is a rejection by the implementation that emptied it.
    """
    had_input = draft.has_input
    for impl in reversed(pm.hook.pre_step.get_hookimpls()):
        _not_wrapped(impl, "pre_step")
        call_impl(impl, "pre_step", step=draft)
        if not isinstance(draft.text, str):
            raise PluginError(f"plugin {impl.plugin_name} set step.text to a "
                              f"{type(draft.text).__name__} in hook pre_step (expected str)",
                              plugin=impl.plugin_name, hook="pre_step")
        if draft.rejected is None and had_input and not draft.has_input:
            draft.rejected = "input rewritten to empty"
        if draft.rejected is not None:
            draft.rejected_by = impl.plugin_name
            return


def _not_wrapped(impl: Any, hook: str) -> None:
    if impl.wrapper or impl.hookwrapper:
        raise PluginError(f"plugin {impl.plugin_name}: hook {hook} cannot be wrapped (it is "
                          "called one implementation at a time); use a plain implementation",
                          plugin=impl.plugin_name, hook=hook)


def check_observers(ctx: RunContext, hook: Any) -> None:
    """At a step boundary: has the agent gained or lost an ``observe_event`` plugin since the
    run started (D7)? O(1) on the normal path: one length compare of a list of 0–2 items."""
    impls = hook.get_hookimpls()
    known = ctx.observer_plugins
    if len(impls) != len(known) or (impls and tuple(i.plugin_name for i in impls) != known):
        ctx.observer_plugins_changed(tuple(i.plugin_name for i in impls))


def _request_fitting(turn: Turn) -> Any:
    """The step's request, kept within the model's context window (dsh.compaction, issue 10):
    compacted first when the history nears the window; compacted and retried once when the
    provider still answers that it is too long."""
    agent = turn.agent
    if agent.compaction == "off":
        return _request(turn)
    from dsh.core.errors import ProviderError
    from dsh.run import compaction

    compaction.maybe_compact(agent, turn.ledger, turn.ctx)
    try:
        return _request(turn)
    except ProviderError as exc:
        if not compaction.is_context_error(exc):
            raise
        compaction.learn_window(agent, exc)
        if compaction.compact_now(agent, turn.ledger, turn.ctx, reason="provider") is None:
            raise
    return _request(turn)


def _request(turn: Turn) -> Any:
    agent = turn.agent
    proj = turn.ledger.projection
    stream = turn.ctx.emit is not None and agent.model.can_stream
    req = ModelRequest(
        model=proj.model, system=proj.system, messages=proj.view(), tools=proj.tools,
        options=proj.options, stream=stream,
    )
    call = ModelCall(req, agent.model, agent.name, turn.on_text if stream else None, proj,
                     agent.info)
    call.on_reasoning = turn.on_reasoning if stream else None
    response = agent.pm.hook.request(call=call)
    if response is None:
        from dsh.core.errors import PluginError

        raise PluginError("no plugin answered the 'request' hook (is dsh.llm.builtin blocked?)",
                          hook="request")
    return response


def run_tools(turn: Turn, calls: Sequence[ToolCall]) -> str | None:
    """Log every call, run them (concurrently unless a tool is sequential), log the results
    in call order.

    Each call reserves ``tool_calls=1`` in the budget chain, in call order, before any is
    dispatched (D8): a call that cannot reserve is not run and gets a ``budget`` result
    (``not run: <limit>``). Returns the first refusal, or ``None`` when every call ran.
    """
    ledger = turn.ledger
    agent = turn.agent
    budget = turn.ctx.budget
    invocations = []
    for call in calls:
        tool = agent.tools.get(call.name)
        child = new_session_id() if tool is not None and tool.subagent else None
        ledger.append(ToolCalled, call_id=call.id, name=call.name, arguments=call.arguments,
                      child_session=child)
        invocations.append(ToolInvocation(call, tool, thaw(call.arguments), agent.name,
                                          child_session=child, handle=agent.info))
    refusals = [budget.reserve(tool_calls=1) for _ in invocations]
    first_refusal = next((r for r in refusals if r), None)
    to_run = [inv for inv, r in zip(invocations, refusals, strict=True) if not r]
    execute = agent.pm.hook.execute
    ran: list[ToolOutcome]
    concurrent = len(to_run) > 1 and not any(
        inv.tool is not None and inv.tool.sequential for inv in to_run
    )
    if concurrent:
        from concurrent.futures import ThreadPoolExecutor  # only when calls run at once

        # Each call runs in its own copy of the run's context, so dsh.context() works inside.
        pool = ThreadPoolExecutor(max_workers=min(8, len(to_run)),
                                  thread_name_prefix="dsh-tool")
        try:
            futures = [
                pool.submit(contextvars.copy_context().run, _execute_one, execute, inv)
                for inv in to_run
            ]
            ran = [f.result() for f in futures]
        finally:
            # On an interrupt, do not wait here for tools still running: the turn is closed
            # (their calls marked interrupted) while they finish in the background.
            pool.shutdown(wait=False, cancel_futures=True)
    else:
        ran = [_execute_one(execute, inv) for inv in to_run]
    results = iter(ran)
    for inv, refused in zip(invocations, refusals, strict=True):
        outcome = ToolOutcome("budget", f"not run: {refused}") if refused else next(results)
        ledger.append(ToolReturned, call_id=inv.call.id, name=inv.call.name,
                      status=outcome.status, output=outcome.output,
                      duration_ms=outcome.duration_ms)
    return first_refusal


def _execute_one(execute: Any, inv: ToolInvocation) -> ToolOutcome:
    token = reserved_call.set(inv)  # its tool_calls unit is reserved (see run_tools)
    try:
        outcome = execute(call=inv)
    finally:
        reserved_call.reset(token)
    if outcome is None:
        return ToolOutcome("error", "no plugin executed the tool (is dsh.tools.registry blocked?)")
    return outcome
