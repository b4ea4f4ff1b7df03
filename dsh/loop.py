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
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.budget import reserved_call
from dsh.errors import BudgetExceeded
from dsh.events import AssistantMessage
from dsh.events import ContextInjected
from dsh.events import StepEnded
from dsh.events import StepRejected
from dsh.events import StepStarted
from dsh.events import ToolCalled
from dsh.events import ToolReturned
from dsh.events import UserMessage
from dsh.hookspecs import hookimpl
from dsh.ledger import new_session_id
from dsh.llm.builtin import ModelCall
from dsh.manager import call_impl
from dsh.messages import Message
from dsh.messages import ModelRequest
from dsh.messages import ToolCall
from dsh.recorder import emit
from dsh.runcontext import RunContext
from dsh.tools import ToolInvocation
from dsh.tools import ToolOutcome

if TYPE_CHECKING:
    from dsh.app import Agent
    from dsh.ledger import Ledger


@attrs.frozen
class InboxItem:
    text: str
    kind: str = "user"  # "user" wakes the loop; "context" waits for the next user message
    source: str = "user"


class Inbox:
    """Every input enters here first (B3). A user message wakes the loop; injected context
    waits until a user message arrives, and is then consumed with it."""

    def __init__(self) -> None:
        self._items: list[InboxItem] = []

    def put(self, text: str, source: str = "user") -> None:
        self._items.append(InboxItem(text, "user", source))

    def inject(self, text: str, source: str = "api") -> None:
        self._items.append(InboxItem(text, "context", source))

    @property
    def awake(self) -> bool:
        """True when a user message is waiting (injected context alone never wakes it)."""
        return any(i.kind == "user" for i in self._items)

    def take(self) -> tuple[list[InboxItem], InboxItem | None]:
        """Everything up to and including the first user message: ``(context, message)``."""
        for idx, item in enumerate(self._items):
            if item.kind == "user":
                context, self._items = self._items[:idx], self._items[idx + 1:]
                return context, item
        return [], None

    def __len__(self) -> int:
        return len(self._items)


@attrs.define(eq=False)
class StepDraft:
    """What ``pre_step`` sees and may change before anything of the step is logged."""

    index: int
    agent: str
    text: str
    context: list[InboxItem]
    messages: Sequence[Message]
    source: str = "user"
    rejected: str | None = None
    rejected_by: str | None = None

    def reject(self, reason: str, plugin: str | None = None) -> None:
        self.rejected = reason or "rejected"
        self.rejected_by = plugin

    @property
    def has_input(self) -> bool:
        return bool(self.text.strip()) or any(c.text.strip() for c in self.context)


@attrs.define(eq=False)
class Turn:
    """The state of one turn, handed to ``run_turn`` and ``turn_stopping``."""

    number: int
    agent: Agent
    ledger: Ledger
    inbox: Inbox
    ctx: RunContext
    max_steps: int
    max_continuations: int = 3
    steps: int = 0
    continuations: int = 0
    output: str = ""
    reason: str = ""
    on_text: Any = None

    @property
    def pm(self) -> Any:
        return self.agent.pm


@hookimpl(trylast=True)
def run_turn(turn: Turn) -> str:
    ctx = turn.ctx
    ledger = turn.ledger
    agent = turn.agent
    hook = agent.pm.hook
    context_items, message = turn.inbox.take()
    text = message.text if message else ""
    source = message.source if message else "user"
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
                          ledger.projection.view(), source)
        had_input = draft.has_input
        emit("agent/pre-step", step=draft.index, text=draft.text)
        hook.pre_step(step=draft)
        if draft.rejected is not None or (had_input and not draft.has_input):
            reason = draft.rejected or "input rewritten to empty"
            ledger.append(StepRejected, turn=turn.number, step=draft.index, reason=reason,
                          plugin=draft.rejected_by, text=text)
            turn.reason = reason
            return "rejected"

        refused = ctx.budget.reserve(steps=1)  # a step is counted before it starts (D8)
        if refused:
            turn.reason = refused
            return "budget"
        ledger.append(StepStarted, turn=turn.number, step=draft.index)
        for item in draft.context:
            ledger.append(ContextInjected, text=item.text, source=item.source)
        if draft.text:
            ledger.append(UserMessage, text=draft.text, source=draft.source)
        context_items, text, source = [], "", "user"
        turn.steps += 1

        try:
            response = _request(turn)
        except BudgetExceeded as exc:  # the request could not reserve its place: not sent
            turn.reason = str(exc)
            return "budget"
        ledger.append(
            AssistantMessage, text=response.text, tool_calls=response.tool_calls,
            usage=response.usage, tool_call_source=response.tool_call_source,
            model=response.model or agent.model_id, stop_reason=response.stop_reason,
        )
        turn.output = response.text
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
        if response.tool_calls:
            continue  # tool results are due to the model
        if turn.inbox.awake:
            context_items, message = turn.inbox.take()
            assert message is not None
            text, source = message.text, message.source
            continue
        if turn.continuations < turn.max_continuations:
            emit("agent/turn-stopping", steps=turn.steps)
            follow = ask_to_continue(turn)
            if follow is not None:
                turn.continuations += 1
                text, source = follow
                continue
        return "completed"


def ask_to_continue(turn: Turn) -> tuple[str, str] | None:
    """Call ``turn_stopping`` as a firstresult hook would, but keep the answering plugin's
    name, so the follow-up message records where it came from."""
    for impl in reversed(turn.agent.pm.hook.turn_stopping.get_hookimpls()):
        if impl.wrapper or impl.hookwrapper:
            continue
        follow = call_impl(impl, "turn_stopping", turn=turn)
        if follow:
            return str(follow), f"plugin:{impl.plugin_name}"
    return None


def _request(turn: Turn) -> Any:
    agent = turn.agent
    proj = turn.ledger.projection
    stream = turn.ctx.emit is not None and agent.model.can_stream
    req = ModelRequest(
        model=proj.model, system=proj.system, messages=proj.view(), tools=proj.tools,
        options=proj.options, stream=stream,
    )
    call = ModelCall(req, agent.model, agent.name, turn.on_text if stream else None, proj)
    response = agent.pm.hook.request(call=call)
    if response is None:
        from dsh.errors import PluginError

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
        invocations.append(ToolInvocation(call, tool, dict(call.arguments), agent.name,
                                          child_session=child))
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
        return ToolOutcome("error", "no plugin executed the tool (is dsh.tools blocked?)")
    return outcome
