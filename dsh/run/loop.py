"""The agent loop (MISSION A1, B1–B4) as the built-in ``run_turn`` implementation.

One turn, in order (docs/architecture.md, "The flow of one message")::

    turn/start → take input from the inbox → pre_step (agent/pre-step) → step/start
    → context/injected* → user/message → request (agent/request, llm/stream)
    → assistant/message → [tool/call* → execute → tool/result*] → step/end
    → more work due? another step : turn_stopping → turn/end (written by the caller)

The model's history for each step is the ledger's projection, never a list kept on the side.

The state the driver works on (:class:`Inbox`, :class:`StepDraft`, :class:`Turn`) lives in
:mod:`dsh.run.turn` and is importable from here as before.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from typing import Any

from dsh.core.errors import BudgetExceeded
from dsh.core.errors import Cancelled
from dsh.core.errors import PluginError
from dsh.core.errors import ProviderError
from dsh.core.messages import Attachment
from dsh.core.messages import ModelRequest
from dsh.core.messages import ToolCall
from dsh.core.messages import Usage
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
from dsh.run.turn import Inbox
from dsh.run.turn import InboxItem
from dsh.run.turn import StepDraft
from dsh.run.turn import Turn
from dsh.tools.dispatch import lean_hook
from dsh.tools.registry import ToolInvocation
from dsh.tools.registry import ToolOutcome

__all__ = ["Inbox", "InboxItem", "StepDraft", "Turn", "run_turn", "run_tools", "stopping",
           "ask_to_continue", "call_pre_step", "check_observers", "keep_partial"]


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
        if ctx.emit is not None:  # (emit's own test, without the call: the run is ctx's)
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
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt) or ctx.cancel.cancelled:
                keep_partial(turn)  # Ctrl-C or --timeout mid-stream: the answer so far stays
                if isinstance(exc, Exception) and not isinstance(exc, Cancelled):
                    # the abort closed the stream: a read error it caused is the cancellation
                    raise Cancelled(f"run aborted: {ctx.cancel.reason}") from exc
            raise
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


_COMPACTION: tuple[Any, int] | None = None


def _load_compaction() -> tuple[Any, int]:
    """dsh.run.compaction (imported on first use: it imports this module), kept: a ``from …
    import`` in the step's path costs microseconds at every step."""
    global _COMPACTION
    from dsh.run import compaction
    from dsh.run.compaction.trigger import MAX_REFUSALS

    _COMPACTION = (compaction, MAX_REFUSALS)
    return _COMPACTION


def _request_fitting(turn: Turn) -> Any:
    """The step's request, kept within the model's context window (dsh.compaction, issues
    10 and 26): compacted first when the history nears the window; after a provider's
    context-length error, compacted (tighter each time, down to the last resort) and
    retried, at most ``MAX_REFUSALS`` times. Where the provider reports the prompt's size,
    the session's estimate is calibrated by it (recorded with the step)."""
    agent = turn.agent
    if agent.compaction == "off":
        return _request(turn)
    compaction, MAX_REFUSALS = _COMPACTION or _load_compaction()  # noqa: N806
    ledger = turn.ledger
    compaction.maybe_compact(agent, ledger, turn.ctx)
    refusals = 0
    while True:
        # What is sent, estimated (raw), for a calibration: only a model with a known window
        # is calibrated, so a step to one without (echo, scripted, an unknown name) skips it.
        sent = (compaction.meter_of(ledger).raw(ledger.projection)
                if compaction.agent_window(agent) else None)
        try:
            response = _request(turn)
        except ProviderError as exc:
            if not compaction.is_context_error(exc) or refusals >= MAX_REFUSALS:
                raise
            refusals += 1
            compaction.learn_window(agent, exc)
            if compaction.compact_now(agent, ledger, turn.ctx, reason="provider",
                                      tighten=refusals) is None:
                raise
            continue
        usage = getattr(response, "usage", None)
        window = compaction.agent_window(agent)
        if usage is not None and window and usage.input_tokens * 4 >= window:
            # Near enough to the window for the count to matter: calibrate (and record).
            if sent is None:  # the window became known during the request
                sent = compaction.meter_of(ledger).raw(ledger.projection)
            compaction.calibrate(ledger, usage.input_tokens, sent)
        return response


def keep_partial(turn: Turn) -> None:
    """The model call of the step was aborted (Ctrl-C, ``--timeout``) while it streamed:
    record the text shown so far as the step's answer, ``stop_reason`` ``interrupted`` (the
    next request carries it as the assistant's message, rebuilt from the ledger like any)."""
    text = "".join(turn._partial)
    turn._partial.clear()
    if not text or turn.ledger.closed:
        return
    turn.ledger.append(AssistantMessage, text=text, usage=Usage(),
                       model=turn.agent.model_id, stop_reason="interrupted")
    turn.output = text


def _kept(turn: Turn) -> Any:
    """``turn.on_text`` that also keeps each delta in ``turn._partial``; once the run is
    aborted, later deltas (already in a buffer) are neither shown nor kept."""
    sink, kept, cancel = turn.on_text, turn._partial, turn.ctx.cancel
    kept.clear()
    if sink is None:
        return None

    def on_text(delta: str) -> None:
        if cancel.cancelled:
            return
        kept.append(delta)
        sink(delta)

    return on_text


def _request(turn: Turn) -> Any:
    agent = turn.agent
    proj = turn.ledger.projection
    stream = turn.ctx.emit is not None and agent.model.can_stream
    req = ModelRequest(
        model=proj.model, system=proj.system, messages=proj.view(), tools=proj.tools,
        options=proj.options, stream=stream,
    )
    call = ModelCall(req, agent.model, agent.name, _kept(turn) if stream else None, proj,
                     agent.info)
    call.on_reasoning = turn.on_reasoning if stream else None
    # An unobserved run leaves the recorder's wrapper out (it would only yield).
    response = lean_hook(agent.pm, "request", observed=turn.ctx.emit is not None)(call=call)
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
    # Without the recorder (unobserved) and the hook dispatch (no pre/post_execute) when
    # they would only yield; every other layer as pluggy orders it.
    execute = lean_hook(agent.pm, "execute", observed=turn.ctx.emit is not None)
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
        changes = outcome.changes
        if changes:  # only what the ledger reads back (a plugin may have appended anything)
            from dsh.tools.changes import checked

            changes = checked(changes)
        status = outcome.status
        if status == "error" and turn.ctx.cancel.cancelled:
            status = "interrupted"  # killed by the abort (Ctrl-C, --timeout): not its failure
        ledger.append(ToolReturned, call_id=inv.call.id, name=inv.call.name,
                      status=status, output=outcome.output,
                      duration_ms=outcome.duration_ms, changes=changes)
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
