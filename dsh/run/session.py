"""An open session of one agent, and one turn of it (MISSION B2, C3, E5).

:class:`Session` holds the session's ledger (locked) and inbox. :meth:`Session.send` runs one
turn: it opens a :class:`~dsh.host.runcontext.RunContext`, records ``turn/start`` with what
the turn's requests carry (the transport is bound to exactly that, C3), calls ``run_turn``,
and — whatever happened — closes the turn in the ledger (dangling calls ``interrupted``, an
open step ended, ``turn/end`` with the outcome and a redacted reason) before the cleanups
run. Also here: steering and injecting from other threads, attachments, plugin events, and
:func:`describe_error` (the one-line reason naming the plugin and hook that raised).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

from dsh.core.errors import Cancelled
from dsh.core.errors import DshError
from dsh.core.errors import InvariantViolation
from dsh.core.errors import OutputSchemaError
from dsh.core.errors import PluginError
from dsh.core.errors import SessionInUse
from dsh.core.errors import UsageError
from dsh.core.messages import Attachment
from dsh.core.messages import Usage
from dsh.core.redact import redact
from dsh.host.manager import plugin_of
from dsh.host.manager import wrapper_failure
from dsh.host.runcontext import Budget
from dsh.host.runcontext import CancelToken
from dsh.host.runcontext import Limits
from dsh.host.runcontext import RunContext
from dsh.host.runcontext import activate
from dsh.host.runcontext import run_mode
from dsh.host.stash import Stash
from dsh.ledger.events import PluginEvent
from dsh.ledger.events import StepEnded
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import TurnEnded
from dsh.ledger.events import TurnStarted
from dsh.ledger.writer import INTERRUPTED
from dsh.ledger.writer import Ledger
from dsh.llm import record
from dsh.llm import schema as output_schemas
from dsh.run.loop import Inbox
from dsh.run.loop import Turn
from dsh.run.prompt import turn_system
from dsh.run.recorder import emit as emit_live
from dsh.run.result import RunResult
from dsh.run.subagent import MAX_DEPTH
from dsh.run.subagent import _parent_link

if TYPE_CHECKING:
    from dsh.run.agent import Agent


def _trust_in_force() -> tuple[dict[str, Any], ...]:
    """This process's workspace-trust decisions: none unless a reader loaded the module."""
    module = sys.modules.get("dsh.config.trust")
    return tuple(module.decisions()) if module is not None else ()


class Session:
    """An open session of one agent: its ledger (locked) and inbox.

    Use as a context manager; :meth:`send` runs one turn. While it runs, another thread may
    :meth:`steer` it (add a user message) or :meth:`inject` context.
    """

    def __init__(self, agent: Agent, ledger: Ledger) -> None:
        self.agent = agent
        self.ledger = ledger
        self.inbox = Inbox()
        #: Input the inbox still held when the session closed (see :meth:`close`).
        self.dropped: list[Any] = []
        self._busy = threading.Lock()
        #: Session scope for plugins (``handle.session_stash``): in memory, as long as this
        #: object lives; a resumed session in a new process starts with an empty one.
        self.stash = Stash()
        #: Attachments stored for the next message sent (:meth:`attach`).
        self._attached: list[Any] = []
        #: The trust decisions last written on this session's ``turn/start`` by this object.
        self._trust_recorded: tuple[dict[str, Any], ...] = ()
        #: The permission mode last written on this session's ``turn/start`` by this object.
        self._mode_recorded: str | None = None
        self.planned_mode: str | None = None  #: chosen with a plan's approval (propose_plan)

    @property
    def id(self) -> str:
        return self.ledger.session_id

    def attach(self, *sources: Any) -> tuple[Attachment, ...]:
        """Read, check and store attachments that go with the next message :meth:`send`
        sends (issue 17; docs/attachments.md).

        A source is a file path (``str`` or ``os.PathLike``), an ``http(s)`` URL (downloaded
        once, now), ``"-"`` (stdin), ``bytes``, ``(bytes, media_type)`` or a
        :class:`dsh.llm.attachments.Input`. The media type is sniffed from the bytes (PNG, JPEG,
        GIF, WebP, PDF), sizes are capped (:data:`dsh.llm.attachments.MAX_BYTES`), and the bytes
        are stored by content hash in the session's store; the ``user/message`` records the
        references.

        :return: the references stored.
        :raises dsh.llm.attachments.AttachmentError: a source that cannot be attached (named).
        :raises dsh.llm.attachments.NotAccepted: the agent's model takes no such attachment
            (named); nothing was stored or sent.
        """
        from dsh.llm import attachments as att

        items = [att.load(s) for s in sources]
        att.check_model(self.agent.model, self.agent.model_id, items)
        refs = att.store(self.ledger.blobs, items)
        self._attached.extend(refs)
        return refs

    def check_attachments(self) -> None:
        """Refuse, naming the model, an agent whose model cannot take the attachments in
        this session's history (a session resumed with another model): before anything is
        sent. O(messages); imports nothing when the history has none."""
        pending = [self._attached] if self._attached else []
        for group in [*pending, *(m.attachments for m in self.ledger.projection.view())]:
            if group:
                from dsh.llm.attachments import check_model

                check_model(self.agent.model, self.agent.model_id, group)

    def inject(self, text: str, source: str = "api") -> None:
        """Queue context for the next user message; it never starts a turn by itself (B3).
        Safe to call from any thread."""
        self.inbox.inject(text, source)

    def record_event(self, plugin: str, name: str, data: Mapping[str, Any] | None = None, *,
                     version: int = 1) -> PluginEvent:
        """Append the plugin event ``x/PLUGIN/NAME`` to this session's ledger (issue 11);
        ``plugin`` must be a plugin of this app (or ``"app"``). Never model-visible: to show
        it to the model, :meth:`inject` it. Safe from any thread; outside a turn it is made
        durable at once. See :mod:`dsh.plugin_events` for the checks.

        :raises dsh.ledger.plugin_events.PluginEventError: (a ``ValueError``) bad name or data."""
        from dsh.host.runcontext import current_or_none
        from dsh.ledger import plugin_events

        ctx = current_or_none()
        return plugin_events.record(
            self.ledger, plugin, name, data, version=version, app=self.agent.app,
            pm=self.agent.pm, durable=ctx is None or ctx.ledger is not self.ledger)

    def plugin_events(self, plugin: str, name: str | None = None) -> Sequence[PluginEvent]:
        """This session's events of ``plugin`` (named ``name``, if given), oldest first,
        written before a restart included; an O(1) read-only view of the ledger's index (no
        file read)."""
        from dsh.ledger import plugin_events

        return plugin_events.read(self.ledger, plugin, name)

    def state(self, key: Any) -> Any:
        """The value of the recorded state ``key`` (a :class:`dsh.ledger.state.StateKey`) in
        this session, updates written before a restart included: folded from the ledger's
        plugin events, the new ones only (no file read)."""
        return key.read(self.ledger.projection)

    def update_state(self, key: Any, data: Mapping[str, Any] | None = None) -> Any:
        """Record an update of ``key`` (the event ``x/PLUGIN/NAME``) and return the new value;
        the reducer runs first, and nothing is recorded if it fails. Safe from any thread;
        outside a turn it is made durable at once (docs/plugin-state.md).

        :raises dsh.ledger.state.StateError: the reducer raised or returned what cannot be
            kept, or the key's plugin is not one of this app's."""
        from dsh.host.runcontext import current_or_none

        value = key.apply(self.ledger, data, app=self.agent.app, pm=self.agent.pm)
        ctx = current_or_none()
        if ctx is None or ctx.ledger is not self.ledger:
            self.ledger.step_boundary()
        return value

    def steer(self, text: str, source: str = "user") -> bool:
        """Add a user message to the turn running in another thread (B3, E5). Safe to call
        from any thread; never blocks on the turn.

        The running turn takes it at its next step boundary — after the step in flight ends,
        with the tool results if any are due — and runs another step with it, recorded as a
        ``user/message`` like any other (with injected context queued before it).

        :return: True when the running turn will take it. False when no turn is running or
            the running one has already decided to stop: the message then waits in the inbox,
            and the next :meth:`send` takes it first, before its own text (``send("")`` runs
            a turn on what waits). A turn that ends another way before its next step boundary
            (stopped, budget, aborted, error) leaves it waiting too: :attr:`pending` counts
            the messages waiting, and :meth:`withdraw` takes them back. Text that is empty or
            only whitespace is no message: nothing is queued and the result is False.
        """
        return self.inbox.put(text, source)

    @property
    def pending(self) -> int:
        """User messages waiting in the inbox for a turn to take them (see :meth:`steer`)."""
        return self.inbox.messages

    def withdraw(self) -> list[str]:
        """Take back the user messages waiting (for instance to put them back in a chat's
        input box after an interrupt); injected context keeps waiting. Safe from any thread."""
        return [item.text for item in self.inbox.withdraw()]

    def send(
        self,
        text: str,
        *,
        observe: bool | None = None,
        on_event: Callable[[Any], None] | None = None,
        on_text: Callable[[str], None] | None = None,
        limits: Limits | None = None,
        on_reasoning: Callable[[str], None] | None = None,
        cancel: CancelToken | None = None,
        parent: RunContext | None = None,
        context_hook: Callable[[RunContext], None] | None = None,
        approve: bool = False,
        budget_parent: Budget | None = None,
        output_schema: Mapping[str, Any] | str | None = None,
        attachments: Sequence[Any] | None = None,
        asker: Callable[[Any], Any] | None = None,  # dsh.Ask -> dsh.Decision
    ) -> RunResult:
        """Run one turn with ``text`` as the user message.

        Messages already waiting in the inbox (see :meth:`steer`) are taken first, each in a
        step of its own, then ``text``. Text that is empty or only whitespace (what
        ``str.strip()`` removes) is no message: with nothing else waiting, no step runs and no
        request is made; the turn still opens and closes in the ledger (outcome
        ``completed``), and injected context keeps waiting for a real message (B3).

        :param observe: force observation on (live events built, provider streams) or off;
            default: observed when ``on_event``/``on_text`` is given or a plugin observes.
        :param on_event: receives every persistent event as written and every live event.
        :param on_text: receives text deltas as they stream.
        :param on_reasoning: receives reasoning (thinking) deltas as they stream, from
            adapters that stream them; never part of the answer (``on_text``, the output).
        :param cancel: the caller's cancellation signal, combined with the run's own.
        :param context_hook: called with the RunContext once it exists (to keep a handle for
            ``stop()`` / ``abort()`` from another thread or a signal handler).
        :param approve: approve tool calls that need approval without asking
            (``RunContext.approve_all``).
        :param asker: answers approval questions in place of the terminal (``RunContext.asker``)
        :param budget_parent: a :class:`~dsh.host.runcontext.Budget` to chain this run's budget
            to when there is no ``parent`` run (``dsh batch`` shares one across its tasks:
            every count is added to it too, and its limits hold over all of them). Ignored
            when ``parent`` is given (the parent run's budget is the chain's).
        :param output_schema: a JSON Schema (a mapping, or what :func:`dsh.llm.schema.load`
            reads: JSON text, a file's path, llm's concise ``"name, age int"``) the answer
            must match. It is recorded with the turn's options and sent by the provider's own
            mechanism; an answer that does not match is sent back once with the problems, then
            the run ends with outcome ``error`` (:class:`~dsh.core.errors.OutputSchemaError`). The
            parsed document is :attr:`RunResult.value`.
        :param attachments: images and PDFs sent with ``text`` (see :meth:`attach` for what
            a source may be); they are read, checked and stored before the turn starts.
        """
        if attachments:
            self.attach(*attachments)
        try:
            self.check_attachments()
        except DshError:
            self._attached.clear()  # refused with the message: never left for a later one
            raise
        schema = None
        if output_schema is not None:
            schema = output_schemas.load(output_schema)  # a bad schema fails before any I/O
        # One turn at a time per session: a second thread sending on the same Session would
        # interleave two turns in one ledger (another process is kept out by the file lock).
        if not self._busy.acquire(blocking=False):
            raise SessionInUse(f"session {self.id} is running a turn in another thread; "
                               "Session.steer(text) adds a message to it")
        try:
            return self._send(text, observe=observe, on_event=on_event, on_text=on_text,
                              limits=limits, cancel=cancel, parent=parent,
                              context_hook=context_hook, approve=approve,
                              budget_parent=budget_parent, on_reasoning=on_reasoning,
                              output_schema=schema, asker=asker)
        finally:
            self._busy.release()

    def _send(self, text: str, *, observe: bool | None, on_event: Callable[[Any], None] | None,
              on_text: Callable[[str], None] | None, limits: Limits | None,
              cancel: CancelToken | None, parent: RunContext | None,
              context_hook: Callable[[RunContext], None] | None, approve: bool,
              budget_parent: Budget | None = None,
              on_reasoning: Callable[[str], None] | None = None,
              output_schema: Mapping[str, Any] | None = None, asker: Any = None) -> RunResult:
        agent = self.agent
        ledger = self.ledger
        pm = agent.pm
        hook_observe = pm.hook.observe_event
        observers = tuple(i.plugin_name for i in hook_observe.get_hookimpls())
        watched = observe if observe is not None else (
            on_event is not None or on_text is not None or on_reasoning is not None
            or bool(observers))
        emit = None
        if watched:
            # Tool calls of one step run in worker threads and emit tools/* events from there:
            # observers receive events one at a time, in the order they were emitted.
            serial = threading.RLock()  # re-entrant: an observer may cause another event

            def emit(event: Any) -> None:
                with serial:
                    if on_event is not None:
                        on_event(event)
                    if ctx.observer_plugins:  # checked again at each step boundary
                        hook_observe(event=event)
                    ctx.notify(event)

            def stream_text(delta: str) -> None:
                emit_live("llm/stream", delta=delta)
                if on_text is not None:
                    on_text(delta)

            def stream_reasoning(delta: str) -> None:
                emit_live("llm/reasoning", delta=delta)
                if on_reasoning is not None:
                    on_reasoning(delta)

        if parent is not None and parent.depth >= MAX_DEPTH:
            raise UsageError(f"sub-agents nested deeper than {MAX_DEPTH} levels")
        ctx = RunContext(
            run_id=os.urandom(6).hex(), agent_name=agent.name, ledger=ledger,
            cancel=CancelToken(cancel), emit=emit,
            budget=Budget(agent.limits.merged(limits),
                          parent=parent.budget if parent else budget_parent),
            approve_all=approve, price=agent.price, parent=parent, observer_plugins=observers,
            session=self, handle=agent.info, mode=run_mode(agent.mode, parent, self.planned_mode),
            asker=asker,
        )
        if context_hook is not None:
            context_hook(ctx)
        ledger.observer = emit
        attached, self._attached = tuple(self._attached), []
        self.inbox.put(text, attachments=attached)
        own = self.inbox.newest() if text.strip() or attached else None  # this turn's message
        self.inbox.open()  # from now on a steered message is taken by this turn
        proj = ledger.projection
        number = proj.turn + 1
        turn = Turn(number, agent, ledger, self.inbox, ctx, agent.max_steps,
                    agent.app.config.max_continuations,
                    on_text=stream_text if watched else None, session=self)
        if watched:
            turn.on_reasoning = stream_reasoning
        outcome = "error"
        error: BaseException | None = None
        bound = None
        with activate(ctx):
            try:
                # What this turn's requests carry besides the history, each written when it
                # changed; the transport sends exactly these, for this run's adapter (C3).
                options = agent.options
                if output_schema is not None:
                    options = {**options, output_schemas.OPTION: output_schema}
                changed = record.record_turn(
                    ledger, model=agent.effective_model, system=turn_system(agent, self),
                    tools=agent.tool_specs, options=options)
                changed.update(record.cwd_change(proj))  # not sent: what -c picks by
                if changed["model"] is not None and proj.answers:  # a switch: see events.md
                    changed["reasoning_withheld"] = withheld_reasoning(agent.model, proj)
                if ctx.mode != self._mode_recorded:  # docs/security.md: permission modes
                    changed["mode"] = self._mode_recorded = ctx.mode
                trust = _trust_in_force()
                if trust and trust != self._trust_recorded:  # docs/security.md: trust
                    changed["trust"] = self._trust_recorded = trust
                ledger.append(TurnStarted, turn=number, agent=agent.name, **changed,
                              **_parent_link(parent, number))
                bound = record.bind(ctx, agent.model, ledger, pm)
                outcome = pm.hook.run_turn(turn=turn) or "completed"
            except Cancelled as exc:
                outcome, turn.reason, error = "aborted", str(exc), exc
            except KeyboardInterrupt as exc:
                # The second Ctrl-C, SIGTERM or SIGHUP: the abort's reason names which.
                reason = ctx.cancel.reason if ctx.cancel.cancelled else "interrupted"
                outcome, turn.reason, error = "aborted", reason, exc
            except Exception as exc:
                outcome, error = "error", wrapper_failure(pm, exc) or exc
                turn.reason = describe_error(pm, error)
            finally:
                self.inbox.close()  # however the turn ended: later messages wait for the next
                if outcome != "completed" and own is not None:  # failed before taking it:
                    self.inbox.mark_returned(own)  # its outcome reports it, not a close warning
                try:
                    self._close_turn(turn, outcome)
                except Exception:
                    # An observer that raises must not keep the ledger from closing the turn.
                    ledger.observer = None
                    self._close_turn(turn, outcome)
                ledger.observer = None
                cleanup_errors = ctx.run_cleanups()
                ctx.cancel.detach()
                if bound is not None:
                    record.unbind(bound)
        if error is None and cleanup_errors:
            error = cleanup_errors[0]
        if isinstance(error, KeyboardInterrupt):
            raise error
        value = None
        if output_schema is not None and outcome == "completed":
            # dsh.llm.schema checked the answer at the turn's end, unless another plugin's
            # follow-up was the last word: then check it here.
            value, found = output_schemas.problems(turn.output, output_schema)
            if found:
                outcome, error = "error", OutputSchemaError(
                    "the answer does not match the output schema: " + "; ".join(found))
                turn.reason = str(error)
        return RunResult(
            value=value,
            output=turn.output, session_id=ledger.session_id, outcome=outcome,
            reason=turn.reason, steps=turn.steps, error=error, path=ledger.path,
            usage=Usage(input_tokens=ctx.budget.input_tokens,
                        output_tokens=ctx.budget.output_tokens,
                        cache_read_tokens=ctx.budget.cache_read_tokens,
                        cache_write_tokens=ctx.budget.cache_write_tokens),
            cost=ctx.budget.cost if ctx.price is not None or ctx.budget.cost else None,
            context=_context_status(agent, ledger),
        )

    def _close_turn(self, turn: Turn, outcome: str) -> None:
        """Whatever happened, leave the ledger consistent: no dangling call, no open step."""
        turn.reason = redact(turn.reason)  # recorded on turn/end, and what the result reports
        ledger = self.ledger
        if ledger.closed:
            return
        p = ledger.projection
        for call in list(p.pending.values()):
            ledger.append(ToolReturned, call_id=call.id, name=call.name, status="interrupted",
                          output=INTERRUPTED)
        if p.step_open:
            ledger.append(StepEnded, turn=p.turn, step=p.step)
        if p.turn_open:
            ledger.append(TurnEnded, turn=turn.number, outcome=outcome, reason=turn.reason)
        ledger.step_boundary()

    def close(self) -> None:
        """Close the ledger. Input still waiting in the inbox is reported: ``dropped`` holds
        it, and what no turn ever took (context injected, a message steered in after the last
        turn stopped taking) is named by an :class:`~dsh.core.errors.InputDroppedWarning`
        (B3: never silently lost; a failed turn's own input was reported by its outcome)."""
        waiting, returned = self.inbox.drain()
        self.dropped.extend(returned)  # the failed turn's outcome and reason reported these
        if waiting:
            self.dropped.extend(waiting)
            import warnings

            from dsh.core.errors import InputDroppedWarning

            kinds = ", ".join(f"{i.kind} from {i.source}" for i in waiting[:5])
            more = f" and {len(waiting) - 5} more" if len(waiting) > 5 else ""
            warnings.warn(InputDroppedWarning(
                f"session {self.ledger.session_id} closed with {len(waiting)} input(s) no turn "
                f"took ({kinds}{more}); they were not recorded or sent"), stacklevel=2)
        self.ledger.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def withheld_reasoning(model: Any, proj: Any) -> int:
    """How many reasoning parts of the history ``model`` will not be sent: those another
    provider family wrote (each adapter replays only its own family's, issue 17). Counted on
    the ``turn/start`` that switches the model (O(history), once per switch)."""
    family = getattr(model, "provider", None)
    return sum(1 for m in proj.view() for r in m.reasoning if r.provider != family)


def _context_status(agent: Agent, ledger: Ledger) -> dict[str, Any] | None:
    if ledger.closed:
        return None
    from dsh.run.compaction import context_status

    return context_status(agent, ledger)


def describe_error(pm: Any, exc: BaseException) -> str:
    """A one-line reason naming the plugin and hook that raised, when it was a plugin; with
    secrets redacted (:func:`dsh.core.redact.redact`): it is shown, and recorded on ``turn/end``."""
    return redact(_describe(pm, exc))


def _describe(pm: Any, exc: BaseException) -> str:
    if isinstance(exc, InvariantViolation) and exc.plugin:
        return str(exc)  # the transport named the plugin that changed the request
    if isinstance(exc, DshError) and not isinstance(exc, PluginError):
        found = plugin_of(pm, exc)
        return f"{exc} (plugin {found[0]}, hook {found[1]})" if found else str(exc)
    found = plugin_of(pm, exc)
    if found:
        return f"plugin {found[0]} raised in hook {found[1]}: {type(exc).__name__}: {exc}"
    if isinstance(exc, DshError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
