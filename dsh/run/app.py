"""The library API: assemble an app from a config, run prompts, resume sessions.

Assembly (MISSION D1) reads the config and builds plugin managers, tool tables and prompts;
it does no other I/O. Execution happens per run: a :class:`~dsh.host.runcontext.RunContext` is
opened,
events are appended to the session ledger, and ``run_turn`` drives the loop.

    app = App.from_config("dsh.toml")          # or a dict, or None for the defaults
    result = app.run("hello", model="echo")
    again = app.run("and then?", session=result.session_id)
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from dsh.config.loader import Config
from dsh.config.loader import config_from_dict
from dsh.config.loader import load_config
from dsh.config.loader import options_error
from dsh.core.errors import Cancelled
from dsh.core.errors import ConfigError
from dsh.core.errors import DshError
from dsh.core.errors import InvariantViolation
from dsh.core.errors import OutputSchemaError
from dsh.core.errors import PluginError
from dsh.core.errors import SessionInUse
from dsh.core.errors import UsageError
from dsh.core.messages import Attachment
from dsh.core.messages import ToolSpec
from dsh.core.messages import Usage
from dsh.core.redact import redact
from dsh.host.manager import PluginRecord
from dsh.host.manager import call_impl
from dsh.host.manager import discover
from dsh.host.manager import make_plugin_manager
from dsh.host.manager import plugin_of
from dsh.host.manager import wrapper_failure
from dsh.host.runcontext import Budget
from dsh.host.runcontext import CancelToken
from dsh.host.runcontext import Limits
from dsh.host.runcontext import RunContext
from dsh.host.runcontext import activate
from dsh.host.scope import AgentHandle
from dsh.host.stash import Stash
from dsh.ledger.events import PluginEvent
from dsh.ledger.events import StepEnded
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import TurnEnded
from dsh.ledger.events import TurnStarted
from dsh.ledger.store import INTERRUPTED
from dsh.ledger.store import Ledger
from dsh.ledger.store import new_session_id
from dsh.llm import schema as output_schemas
from dsh.llm import transport
from dsh.llm.base import Model
from dsh.llm.base import ModelEntry
from dsh.run.loop import Inbox
from dsh.run.loop import Turn
from dsh.run.prompt import collect_prompt
from dsh.run.recorder import emit as emit_live
from dsh.run.result import RunResult as RunResult  # re-exported: dsh.RunResult
from dsh.tools.registry import ToolDef
from dsh.tools.registry import collect_tools

#: Serialises the lazy, first-use construction of agents and adapters (re-entrant: building
#: an agent may build another's pieces).
_BUILD_LOCK = threading.RLock()


class Agent:
    """An assembled agent: its own plugin manager (scope), tools, prompt and model."""

    def __init__(self, app: App, name: str, *, model: str | None = None,
                 system: str | None = None, tools: list[str] | None = None,
                 max_steps: int | None = None, options: Mapping[str, Any] | None = None,
                 compaction: str | None = None) -> None:
        cfg = app.config
        acfg = cfg.agent_config(name)
        self.app = app
        self.name = name
        self.model_id = model or acfg.model or app.default_model.id
        self.max_steps = max_steps if max_steps is not None else (
            acfg.max_steps if acfg.max_steps is not None else cfg.max_steps)
        if options:
            problem = options_error(options, "options")
            if problem is not None:
                raise UsageError(f"agent {name!r}: {problem}")
        # Options, lowest first: the adapter's defaults, [models.ID] options, [agents.X]
        # options, -o / options=. All of them are recorded on turn/start (C3); none may set a
        # protocol key. Merged once the adapter is known (see `options`).
        where = cfg.source or "config"
        model_options = cfg.models.get(self.model_id, {}).get("options") or {}
        if not isinstance(model_options, Mapping):
            raise ConfigError(f"{where}: [models.{self.model_id!r}] options must be a table")
        self._option_layers: list[tuple[str, Mapping[str, Any]]] = [
            (f"{where}: [models.{json.dumps(self.model_id)}] options", model_options),
            (f"{where}: [agents.{name}] options", acfg.options),
            ("-o / options= override", options or {}),
        ]
        for source, layer in self._option_layers:
            transport.check_option_keys(layer, source)
        self._options: Mapping[str, Any] | None = None
        #: Context compaction (dsh.compaction): strategy, trigger fraction, window, summariser.
        self.compaction: str = compaction or acfg.compaction or cfg.compaction
        self.compact_at: float = acfg.compact_at or cfg.compact_at
        self.context_window: int | None = acfg.context_window or cfg.context_window
        self.summary_model: str | None = acfg.summary_model or cfg.summary_model
        #: What hooks reach as ``agent`` / ``.handle`` (issue 11); ``info`` is its old name.
        self.handle = self.info = AgentHandle(
            name=name, model=self.model_id, settings=attrs.asdict(acfg),
            plugins=tuple(acfg.plugins) if acfg.plugins is not None else None,
            all_plugin_settings=cfg.plugins, stash=app.agent_stash(name), app_stash=app.stash,
        )
        installed = [r.name for r in app.plugins if r.obj is not None]
        chosen = app.pm.hook.agent_plugins(agent=self.info, installed=installed)
        unknown = [p for p in chosen if p not in {r.name for r in app.plugins}]
        if unknown:
            where = f" ({cfg.source})" if cfg.source else ""
            raise UsageError(
                f"agent {name!r}{where}: unknown plugin(s) {', '.join(unknown)}; installed: "
                + (", ".join(installed) or "none")
            )
        self.plugin_names = tuple(chosen)
        if list(chosen) == installed:
            # Every installed plugin: the agent's scope is the app-wide one; share it.
            self.pm = app.pm
        else:
            records = [r for r in app.plugins if r.name in set(chosen)]
            self.pm = make_plugin_manager(records, cfg.disable, cfg.strict_plugins, complete=True,
                                          where=f"{cfg.source or 'config'}: agent {name!r}")
            configure(self.pm, app)
        allow = tools if tools is not None else acfg.tools
        self.tools: dict[str, ToolDef] = collect_tools(self.pm, self.info)
        for child in acfg.subagents:
            check_subagent(app, name, child)
            sub_tool = subagent_tool(app, child)
            self.tools[sub_tool.name] = sub_tool
        if allow is not None:
            check_tool_names(app, name, allow, self.tools, override=tools is not None)
            self.tools = {k: v for k, v in self.tools.items() if k in allow}
        self.limits: Limits = cfg.limits.merged(acfg.limits)
        self.tool_specs: tuple[ToolSpec, ...] = tuple(t.spec for t in self.tools.values())
        self.system, self.prompt_parts = collect_prompt(
            self.pm, self.info, system if system is not None else acfg.system)
        self._model: Model | None = None

    @property
    def model(self) -> Model:
        """The adapter, built on first use (so assembling never imports provider code) — once,
        also when parallel runs of the agent (sub-agents) start at the same moment: a run is
        bound to the adapter it recorded (C3), so every run must see the same one."""
        model = self._model
        if model is None:
            with _BUILD_LOCK:
                if self._model is None:
                    self._model = self.app.build_model(self.model_id)
                model = self._model
        return model

    @property
    def options(self) -> Mapping[str, Any]:
        """The effective model options (read-only): adapter defaults, then ``[models.ID]``,
        ``[agents.NAME]`` and override options. Exactly these are recorded and sent."""
        if self._options is None:
            self._options = transport.merge_options(self.model, self._option_layers)
        return self._options

    @options.setter
    def options(self, value: Mapping[str, Any]) -> None:
        # A plugin may replace them: they are checked, frozen and recorded on the next turn.
        self._option_layers = [("agent.options (set by a plugin)", dict(value))]
        self._options = transport.merge_options(self.model, self._option_layers)

    @property
    def effective_model(self) -> str:
        """The model id recorded on ``turn/start``: the adapter's effective id, if it has
        one (an alias resolved), else the configured id."""
        return self.model.effective_id or self.model_id

    @property
    def price(self) -> tuple[float | None, ...] | None:
        """``(input, output, cache_read, cache_write)`` price per million tokens from
        ``[models.ID] price`` (:func:`dsh.run.budget.model_price`; a cache price not given is
        None: a default multiple of the input price applies)."""
        from dsh.run.budget import model_price

        return model_price(self.model_id, self.app.config.models.get(self.model_id))

    @property
    def observed(self) -> bool:
        """True when some plugin of this agent implements ``observe_event``."""
        return bool(self.pm.hook.observe_event.get_hookimpls())


class Session:
    """An open session of one agent: its ledger (locked) and inbox.

    Use as a context manager; :meth:`send` runs one turn. While it runs, another thread may
    :meth:`steer` it (add a user message) or :meth:`inject` context.
    """

    def __init__(self, agent: Agent, ledger: Ledger) -> None:
        self.agent = agent
        self.ledger = ledger
        self.inbox = Inbox()
        self._busy = threading.Lock()
        #: Session scope for plugins (``handle.session_stash``): in memory, as long as this
        #: object lives; a resumed session in a new process starts with an empty one.
        self.stash = Stash()
        #: Attachments stored for the next message sent (:meth:`attach`).
        self._attached: list[Any] = []

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
                              output_schema=schema)
        finally:
            self._busy.release()

    def _send(self, text: str, *, observe: bool | None, on_event: Callable[[Any], None] | None,
              on_text: Callable[[str], None] | None, limits: Limits | None,
              cancel: CancelToken | None, parent: RunContext | None,
              context_hook: Callable[[RunContext], None] | None, approve: bool,
              budget_parent: Budget | None = None,
              on_reasoning: Callable[[str], None] | None = None,
              output_schema: Mapping[str, Any] | None = None) -> RunResult:
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
            run_id=os.urandom(6).hex(), agent=agent.name, ledger=ledger,
            cancel=CancelToken(cancel), emit=emit,
            budget=Budget(agent.limits.merged(limits),
                          parent=parent.budget if parent else budget_parent),
            approve_all=approve, price=agent.price, parent=parent, observer_plugins=observers,
            session=self, handle=agent.info,
        )
        if context_hook is not None:
            context_hook(ctx)
        ledger.observer = emit
        attached, self._attached = tuple(self._attached), []
        self.inbox.put(text, attachments=attached)
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
                changed = transport.record_turn(
                    ledger, model=agent.effective_model, system=agent.system,
                    tools=agent.tool_specs, options=options)
                if changed["model"] is not None and proj.answers:  # a switch: see events.md
                    changed["reasoning_withheld"] = withheld_reasoning(agent.model, proj)
                ledger.append(TurnStarted, turn=number, agent=agent.name, **changed,
                              **_parent_link(parent, number))
                bound = transport.bind(ctx, agent.model, ledger, pm)
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
                    transport.unbind(bound)
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
        self.ledger.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_subagent(app: App, agent: str, child: str) -> None:
    """``child`` of ``[agents.AGENT] subagents`` is a configured agent."""
    names = app.config.agent_names()
    if child not in names:
        from dsh.config.loader import unknown_name
        from dsh.core.errors import ConfigError

        raise ConfigError(f"{app.config.source or 'config'}: key 'agents.{agent}.subagents': "
                          + unknown_name("agent", child, names, "configured"))


def check_tool_names(app: App, agent: str, allow: list[str], available: Mapping[str, Any],
                     override: bool) -> None:
    """Every name of a tool allow list names a tool: a typo would silently leave the agent
    without it. Unchecked while a plugin of the agent failed to load (its tools are unknown;
    that failure is reported on its own)."""
    acfg = app.config.agent_config(agent)
    if any(r.error and (acfg.plugins is None or r.name in acfg.plugins) for r in app.plugins):
        return
    for tool_name in allow:
        if tool_name not in available:
            from dsh.config.loader import unknown_name

            message = unknown_name("tool", tool_name, available, "available")
            if override:
                raise UsageError(f"agent {agent!r}: tools: {message}")
            from dsh.core.errors import ConfigError

            raise ConfigError(f"{app.config.source or 'config'}: key 'agents.{agent}.tools': "
                              f"{message}")


def _context_status(agent: Agent, ledger: Ledger) -> dict[str, Any] | None:
    if ledger.closed:
        return None
    from dsh.run.compaction import context_status

    return context_status(agent, ledger)


#: ``(environment variable, model id)``: the model used when the config sets none and the
#: variable holds a key, in this order.
PROVIDER_DEFAULTS: tuple[tuple[str, str], ...] = (
    ("OPENAI_API_KEY", "openai:gpt-4o-mini"),
    ("ANTHROPIC_API_KEY", "anthropic:claude-haiku-4-5"),
)


@attrs.frozen
class DefaultModel:
    """The default model: its ``id``, ``why`` it was chosen, and whether it is the offline
    ``echo`` fallback (``dsh run`` and ``dsh chat`` then say so on stderr)."""

    id: str
    why: str
    fallback: bool = False


def choose_default_model(app: App) -> DefaultModel:
    cfg = app.config
    if cfg.model:
        return DefaultModel(cfg.model, f"set in {cfg.source or 'the config'}")
    for env, model in PROVIDER_DEFAULTS:
        if os.environ.get(env, "").strip():
            return DefaultModel(model, f"no model configured and {env} is set")
    offered = app.pm.hook.default_model()
    if offered:
        model, why = offered
        return DefaultModel(str(model), f"no model configured and no provider key set; {why}")
    return DefaultModel("echo", "no model configured, no provider key in the environment "
                                "(OPENAI_API_KEY, ANTHROPIC_API_KEY) and no local model",
                        fallback=True)


def configure(pm: Any, app: App) -> None:
    """Call the historic ``configure`` hook; a plugin raising is named with the hook."""
    try:
        pm.hook.configure.call_historic(kwargs={"app": app, "pm": pm})
    except DshError:
        raise
    except Exception as exc:
        found = plugin_of(pm, exc)
        who = f"plugin {found[0]}" if found else "a plugin"
        raise PluginError(f"{who} raised in hook configure: {type(exc).__name__}: {exc}",
                          plugin=found[0] if found else "", hook="configure") from exc


MAX_DEPTH = 8


def withheld_reasoning(model: Any, proj: Any) -> int:
    """How many reasoning parts of the history ``model`` will not be sent: those another
    provider family wrote (each adapter replays only its own family's, issue 17). Counted on
    the ``turn/start`` that switches the model (O(history), once per switch)."""
    family = getattr(model, "provider", None)
    return sum(1 for m in proj.view() for r in m.reasoning if r.provider != family)


def _parent_link(parent: RunContext | None, turn: int) -> dict[str, Any]:
    """``parent``/``parent_call`` of a child session's first turn (links both ways)."""
    if parent is None or turn != 1:
        return {}
    from dsh.tools.registry import current_call

    try:
        call_id: str | None = current_call().call.id
    except LookupError:
        call_id = None
    return {"parent": parent.session_id, "parent_call": call_id}


def subagent_tool(app: App, child: str) -> ToolDef:
    """The ``ask_CHILD`` tool: runs agent ``child`` in a nested run with a chained budget."""
    if child not in app.config.agent_names():
        raise UsageError(f"sub-agent {child!r} is not a configured agent "
                         f"(configured: {', '.join(app.config.agent_names())})")
    description = app.config.agent_config(child).description or f"Ask the {child} agent."

    def ask(prompt: str) -> str:
        from dsh.core.errors import ToolError
        from dsh.host.runcontext import context
        from dsh.tools.registry import current_call

        parent = context()
        agent = app.agent(child)
        with app.open_session(agent, current_call().child_session, create=True) as session:
            result = session.send(prompt, parent=parent, cancel=parent.cancel,
                                  approve=parent.approve_all)
        if result.outcome in ("error", "aborted", "rejected"):
            raise ToolError(f"sub-agent {child} ended with {result.outcome}: {result.reason}")
        if result.outcome == "budget":
            # Its run could not reserve a step, request or tool call in the chain (D8).
            if not result.output:
                raise ToolError(f"sub-agent {child} stopped by a budget limit before "
                                f"answering: {result.reason}")
            return (f"{result.output}\n[sub-agent {child} stopped by a budget limit: "
                    f"{result.reason}]")
        return result.output

    return ToolDef(
        name=f"ask_{child}", description=description,
        parameters={"type": "object", "properties": {"prompt": {
            "type": "string", "description": f"what to ask the {child} agent"}},
            "required": ["prompt"], "additionalProperties": False},
        fn=ask, plugin="dsh.subagents", subagent=child,
    )


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


class App:
    """An assembled dsh application: config, plugins, agents, session store."""

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or Config()
        self._plugins: list[PluginRecord] | None = None
        self._pm: Any = None
        self._agents: dict[Any, Agent] = {}
        self._models: dict[str, ModelEntry] | None = None
        self._store: Any = None
        self._default_model: DefaultModel | None = None
        #: App scope for plugins (``handle.app_stash``): as long as this object lives.
        self.stash = Stash()
        self._agent_stashes: dict[str, Stash] = {}

    def agent_stash(self, name: str) -> Stash:
        """The agent-scope stash of agent ``name`` in this app (``handle.stash``): shared by
        its variants with overrides (``agent(name, model=…)``), never by another app."""
        return self._agent_stashes.setdefault(name, Stash())

    @classmethod
    def from_config(cls, source: str | Path | Mapping[str, Any] | None = None) -> App:
        """Assemble from a TOML file path, a mapping, or (``None``) the default config file."""
        if isinstance(source, Mapping):
            return cls(config_from_dict(source))
        return cls(load_config(source))

    @property
    def plugins(self) -> list[PluginRecord]:
        """Installed plugins (imported once), with their load errors."""
        if self._plugins is None:
            cfg = self.config
            self._plugins = discover(cfg.autoload, cfg.load, cfg.strict_plugins,
                                     cfg.disable, cfg.source or "config")
        return self._plugins

    @property
    def pm(self) -> Any:
        """The app-wide plugin manager: built-ins plus every installed plugin."""
        if self._pm is None:
            cfg = self.config
            self._pm = make_plugin_manager(self.plugins, cfg.disable, cfg.strict_plugins,
                                           complete=True, where=cfg.source or "config")
            try:
                configure(self._pm, self)  # a plugin's configure may already use app.pm
            except BaseException:
                self._pm = None  # half-configured: the next use fails the same way
                raise
        return self._pm

    @property
    def store(self) -> Any:
        if self._store is None:
            self._store = self.pm.hook.session_store(app=self)
            if self._store is None:
                raise PluginError("no plugin provides 'session_store' (is dsh.ledger blocked?)",
                                  hook="session_store")
        return self._store

    @property
    def default_model(self) -> DefaultModel:
        """The model of agents that set none, and why it was chosen: the config's ``model``;
        else the first provider whose API key is in the environment
        (:data:`PROVIDER_DEFAULTS`); else what a plugin offers (``default_model`` hook, e.g.
        dsh-llama when a local model is installed); else the offline ``echo`` model."""
        if self._default_model is None:
            self._default_model = choose_default_model(self)
        return self._default_model

    @property
    def models(self) -> dict[str, ModelEntry]:
        if self._models is None:
            table: dict[str, ModelEntry] = {}
            for impl in self.pm.hook.register_models.get_hookimpls():
                plugin = impl.plugin_name

                def register(prefix: str, factory: Any, description: str = "",
                             _plugin: str = plugin) -> None:
                    if prefix in table:
                        raise PluginError(
                            f"model prefix {prefix!r} registered twice: by "
                            f"{table[prefix].plugin} and {_plugin}", plugin=_plugin,
                            hook="register_models")
                    table[prefix] = ModelEntry(prefix, factory, _plugin, description)

                call_impl(impl, "register_models", register=register)
            self._models = table
        return self._models

    def build_model(self, model_id: str) -> Model:
        """The adapter for ``model_id`` (``echo``, ``scripted:PATH``, ``openai:gpt-4o``, or a
        ``[models.ID]`` alias with an ``adapter`` key)."""
        settings = dict(self.config.models.get(model_id, {}))
        if "adapter" in settings:
            prefix, name = settings["adapter"], settings.get("model", model_id)
        else:
            prefix, _, name = model_id.partition(":")
        entry = self.models.get(prefix)
        if entry is None:
            known = ", ".join(sorted(self.models)) or "none"
            raise UsageError(f"unknown model {model_id!r}: no adapter {prefix!r} "
                             f"(known: {known})")
        model = entry.build(name, settings)
        model.check()
        return model

    def agent(self, name: str | None = None, **overrides: Any) -> Agent:
        """The assembled agent ``name`` (default: the config's ``agent``), memoised."""
        name = name or self.config.agent
        if name not in self.config.agent_names():
            known = ", ".join(self.config.agent_names())
            raise UsageError(f"unknown agent {name!r} (configured: {known})")
        key = (name, tuple(sorted((k, repr(v)) for k, v in overrides.items())))
        agent = self._agents.get(key)
        if agent is None:
            with _BUILD_LOCK:  # parallel sub-agents of one name share one Agent
                agent = self._agents.get(key)
                if agent is None:
                    agent = self._agents[key] = Agent(self, name, **overrides)
        return agent

    def open_session(self, agent: Agent, session_id: str | None = None, *,
                     save: bool = True, create: bool = False) -> Session:
        """A new session (``session_id=None``), or an existing one resumed; with ``create``,
        a new session with the given id (sub-agents choose their child's id up front)."""
        # Resolve the adapter (and check its key) before any I/O, and convert the tool table
        # to the provider's format now, once, rather than on every request (D1).
        agent.model.provider_tools(agent.tool_specs)
        _ = agent.options  # merged and checked now: a protocol key is a ConfigError, no I/O
        if not save:
            if session_id is not None:
                raise UsageError("--no-save cannot resume a saved session")
            return Session(agent, Ledger(new_session_id()))
        if session_id is None or create:
            return Session(agent, self.store.create(session_id))
        return Session(agent, self.store.open(session_id))

    def session(self, agent: str | None = None, session_id: str | None = None, *,
                save: bool = True, **overrides: Any) -> Session:
        return self.open_session(self.agent(agent, **overrides), session_id, save=save)

    def run(self, prompt: str, *, agent: str | None = None, session: str | None = None,
            save: bool = True, inject: list[str] | None = None, **kwargs: Any) -> RunResult:
        """Run ``prompt`` as one turn; ``session`` resumes that session.

        Agent overrides (``model``, ``system``, ``tools``, ``max_steps``, ``options``) and
        :meth:`Session.send` options are accepted as keywords.
        """
        overrides = {k: kwargs.pop(k) for k in ("model", "system", "tools", "max_steps",
                                                "options") if kwargs.get(k) is not None}
        with self.session(agent, session, save=save, **overrides) as s:
            for item in inject or ():
                s.inject(item)
            return s.send(prompt, **kwargs)

    def parallel(self, tasks: list[tuple[str, str]], *, parent: Session | None = None,
                 limits: Limits | None = None, max_workers: int = 4) -> list[RunResult]:
        """Run several agents at once (MISSION D6); return their results in task order.

        :param tasks: ``(agent, prompt)`` pairs.
        :param parent: a session whose history each task starts from — a frozen read, taken
            once before any task runs, injected into each child session as context (so it is
            in the child's ledger, C3) — and into whose inbox the results are then injected
            in task order, whatever order they finished in.

        Each task runs in its own thread, in its own copy of the caller's context, in its own
        session. A task that fails is reported in its result and does not affect the others.

        Called inside a run (from a tool or a hook), each task is a nested run of it: its
        budget is chained to the run's, so the run's limits hold over all the tasks together
        (D8); the run's cancellation reaches it; its first ``turn/start`` names the run's
        session as ``parent``.
        """
        import contextvars
        from concurrent.futures import ThreadPoolExecutor

        from dsh.host.runcontext import current_or_none
        from dsh.ledger.history import render_history

        frozen = render_history(parent.ledger.projection.view()) if parent else ""
        run = current_or_none()

        def one(agent: str, prompt: str) -> RunResult:
            try:
                with self.session(agent) as session:
                    if frozen:
                        session.inject(frozen, source=f"fork:{parent.id}")  # type: ignore[union-attr]
                    if run is None:
                        return session.send(prompt, limits=limits)
                    return session.send(prompt, limits=limits, parent=run, cancel=run.cancel,
                                        approve=run.approve_all)
            except Exception as exc:  # a task that cannot even start is reported, not raised
                return RunResult(output="", session_id="", outcome="error",
                                 reason=describe_error(self.pm, exc), error=exc)

        with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(tasks))),
                                thread_name_prefix="dsh-parallel") as pool:
            futures = [pool.submit(contextvars.copy_context().run, one, agent, prompt)
                       for agent, prompt in tasks]
            results = [f.result() for f in futures]
        if parent is not None:
            for (agent, _), r in zip(tasks, results, strict=True):
                body = r.output if r.outcome == "completed" else f"{r.outcome}: {r.reason}"
                parent.inject(body, source=f"parallel:{agent}:{r.session_id or '-'}")
        return results

