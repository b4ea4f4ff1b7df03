"""RunContext (MISSION D2): the unit of isolation of one run, carried in a contextvar.

``context()`` is a free function: it works anywhere inside a run (hooks, tools, adapters) and
raises :class:`~dsh.core.errors.NoRunContext` outside one, including in a thread that was started
without ``contextvars.copy_context()``, instead of returning another run's data.
"""

from __future__ import annotations

import contextvars
import threading
import time
import warnings
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING
from typing import Any
from typing import ClassVar

import attrs

from dsh.core.errors import Cancelled
from dsh.core.errors import NoRunContext
from dsh.host.stash import Stash

if TYPE_CHECKING:
    from dsh.host.scope import AgentHandle
    from dsh.ledger.writer import Ledger
    from dsh.run.session import Session

class UnobservedRunWarning(UserWarning):
    """An observer was added to a run that was started without observation."""


_current: contextvars.ContextVar[RunContext] = contextvars.ContextVar("dsh_run_context")


class CancelToken:
    """A run's cancellation signal: the caller's signal (``parent``) combined with the handle's
    own ``abort()``. Callbacks registered with :meth:`on_cancel` run once, when it fires (an
    HTTP adapter closes its in-flight stream there)."""

    def __init__(self, parent: CancelToken | None = None) -> None:
        self._event = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self.reason = ""
        self._detach: Callable[[], None] = lambda: None
        if parent is not None:
            self._detach = parent.on_cancel(lambda: self.cancel(parent.reason))

    def detach(self) -> None:
        """Stop listening to the parent's signal (the run ended): a long-lived parent token,
        such as a batch's or a chat's, must not keep a callback per finished child run."""
        self._detach()
        self._detach = lambda: None

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self, reason: str = "aborted") -> None:
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb()

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when the token fires (at once if it already has). Returns a function
        that unregisters it."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return lambda: self._remove(callback)
        callback()
        return lambda: None

    def _remove(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    def check(self) -> None:
        """Raise :class:`Cancelled` if the token has fired."""
        if self._event.is_set():
            raise Cancelled(f"run aborted: {self.reason}")

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)


LIMIT_NAMES = ("steps", "requests", "tool_calls", "input_tokens", "output_tokens",
               "total_tokens", "cost", "seconds")


@attrs.frozen(kw_only=True)
class Limits:
    """Budget limits of one run; ``None`` means unlimited. ``cost`` is in the currency of the
    config's price table (``[models.ID] price = {input = …, output = …}`` per million tokens)."""

    steps: int | None = None
    requests: int | None = None
    tool_calls: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    cost: float | None = None
    seconds: float | None = None

    def merged(self, other: Limits | None) -> Limits:
        """These limits, overridden by every limit ``other`` sets."""
        if other is None:
            return self
        changes = {n: getattr(other, n) for n in LIMIT_NAMES if getattr(other, n) is not None}
        return attrs.evolve(self, **changes)


#: The counted units a :meth:`Budget.reserve` can take, with their names in a reason.
_COUNTED = (("steps", "steps"), ("requests", "model requests"), ("tool_calls", "tool calls"))


#: Sets a counter without attrs' ``__setattr__`` (written for ``limits``' frozen hook, a
#: Python call per assignment, several per step); counters have no hook of their own.
_set = object.__setattr__


def _counters_only(counts: dict[str, Any]) -> None:
    if "limits" in counts or "parent" in counts:
        raise TypeError("a budget's limits and parent are not counters")


@attrs.define
class Budget:
    """Counters of one run (MISSION D8).

    A nested run's budget is chained to its parent's: every count is added to each ancestor
    too, and every check looks up the whole chain, so the first limit reached — the run's own
    or any ancestor's — stops it.

    Counted units (steps, model requests, tool calls) are *reserved* before they start, with
    :meth:`reserve`: under one lock shared by the whole chain, the unit is checked against
    every level and added to every level, or refused at all of them. A unit that cannot
    reserve does not run, so these limits are exact under any concurrency. Tokens and cost are
    known only once a call has resolved (:meth:`add`), and time passes while units run: those
    limits stop new units from starting, and may be overshot by the units already running
    (docs/execution.md, "Budgets").

    A level whose :attr:`remote` is true keeps its counters elsewhere (dsh-ray's budget, one
    counter for a whole cluster): a walk up the chain stops there and hands it the rest, and
    its own ``reserve``/``add``/``exceeded`` are atomic where the counters are. Such a level
    names its refusals "… in a parent run" itself.
    """

    #: True for a level whose counters live in another process (see above).
    remote: ClassVar[bool] = False
    #: Fixed for the budget's life (the checks are prepared from it).
    limits: Limits = attrs.field(factory=Limits, on_setattr=attrs.setters.frozen)
    parent: Budget | None = None
    steps: int = 0
    requests: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    #: Parts of ``input_tokens`` read from / written to a provider's prompt cache.
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost: float = 0.0
    #: The clock the time limit reads (``time.monotonic``; a test may pass its own).
    clock: Callable[[], float] = attrs.field(default=time.monotonic, repr=False, eq=False)
    started: float = attrs.Factory(lambda self: self.clock(), takes_self=True)
    #: One lock for the whole chain (the root's), so a reservation is atomic across levels.
    _lock: threading.Lock = attrs.field(init=False, repr=False, eq=False)
    #: The counted limits this level sets, ``(key, name, limit)``, and whether it sets any
    #: other (tokens, cost, time): computed once, so a check costs nothing for unset limits.
    _counted: tuple[tuple[str, str, int], ...] = attrs.field(init=False, repr=False, eq=False)
    _spent: bool = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        self._lock = self.parent._lock if self.parent is not None else threading.Lock()
        lim = self.limits
        self._counted = tuple((key, name, getattr(lim, key)) for key, name in _COUNTED
                              if getattr(lim, key) is not None)
        self._spent = any(v is not None for v in (lim.input_tokens, lim.output_tokens,
                                                  lim.total_tokens, lim.cost, lim.seconds))

    def add(self, **counts: float) -> None:
        """Add ``counts`` to this budget and every ancestor (no check: usage already spent)."""
        _counters_only(counts)
        with self._lock:
            b: Budget | None = self
            while b is not None and not b.remote:
                for key, value in counts.items():
                    _set(b, key, getattr(b, key) + value)
                b = b.parent
            if b is not None:
                b.add(**counts)

    def reserve(self, **counts: int) -> str | None:
        """Take ``counts`` of counted units (``steps``, ``requests``, ``tool_calls``) at every
        level of the chain, atomically, before the units start.

        Refused — nothing is added anywhere — when adding them would take some level over its
        limit (``used + n > limit``), or when some level has already reached any other limit
        (tokens, cost, time). Returns ``None`` when reserved, else the refusing limit as a
        sentence (an ancestor's names it as "… in a parent run (used/limit)").
        """
        _counters_only(counts)
        with self._lock:
            b: Budget | None = self
            depth = 0
            while b is not None and not b.remote:
                reason = b._refusal(counts, depth)
                if reason:
                    return reason
                b = b.parent
                depth += 1
            top = b
            if top is not None:  # the remote level reserves (atomically) or refuses there
                reason = top.reserve(**counts)
                if reason:
                    return reason
            b = self
            while b is not top and b is not None:
                for key, n in counts.items():
                    _set(b, key, getattr(b, key) + n)
                b = b.parent
        return None

    def exceeded(self) -> str | None:
        """The first limit reached in the chain, as a sentence, or ``None``."""
        with self._lock:
            b: Budget | None = self
            depth = 0
            while b is not None and not b.remote:
                reason = b._refusal({}, depth)
                if reason:
                    return reason
                b = b.parent
                depth += 1
        return b.exceeded() if b is not None else None

    def _refusal(self, counts: dict[str, int], depth: int) -> str | None:
        """Why this level refuses ``counts`` more units (``{}``: has it reached a limit?)."""
        where = " in a parent run" if depth else ""
        for key, name, limit in self._counted:
            used = getattr(self, key)
            if used + counts.get(key, 0) > limit or used >= limit:
                return f"{name} limit reached{where} ({used}/{limit})"
        if not self._spent:
            return None
        lim = self.limits
        used_tokens = (("input tokens", self.input_tokens, lim.input_tokens),
                       ("output tokens", self.output_tokens, lim.output_tokens),
                       ("total tokens", self.input_tokens + self.output_tokens,
                        lim.total_tokens))
        for name, tokens, most in used_tokens:
            if most is not None and tokens >= most:
                return f"{name} limit reached{where} ({tokens}/{most})"
        if lim.cost is not None and self.cost >= lim.cost:
            return f"cost limit reached{where} ({self.cost:.4f}/{lim.cost:g})"
        if lim.seconds is not None:
            elapsed = self.clock() - self.started
            if elapsed >= lim.seconds:
                return f"time limit reached{where} ({elapsed:.1f}s/{lim.seconds:g}s)"
        return None


#: The permission modes, from the narrowest to the widest (:mod:`dsh.tools.approval`).
MODES = ("read-only", "plan", "ask", "auto-edit", "full-auto")
DEFAULT_MODE = "ask"


def check_mode(mode: str, where: str = "--mode") -> str:
    """``mode`` if it is one of :data:`MODES`, else a usage error naming ``where``."""
    if mode not in MODES:
        from dsh.core.errors import UsageError
        from dsh.core.errors import unknown_name

        raise UsageError(f"{where}: " + unknown_name("mode", mode, MODES, "known"))
    return mode


def narrower(a: str, b: str) -> str:
    """The narrower of two modes (a sub-agent runs under the narrower of its own and its
    parent's)."""
    return a if MODES.index(a) <= MODES.index(b) else b


def run_mode(own: str, parent: RunContext | None, planned: str | None = None) -> str:
    """A run's mode: the agent's ``own`` (a ``plan`` agent's, once its plan is approved: the
    ``planned`` one chosen then), narrowed by its parent run's (a sub-agent's)."""
    own = planned if planned and own == "plan" else own
    return narrower(own, parent.mode) if parent else own


@attrs.define(eq=False)
class RunContext:
    """The state of one run. Obtain it with :func:`dsh.context` inside the run."""

    #: A random id of this run (not recorded).
    run_id: str
    #: The agent's name (``handle`` is the agent itself: its settings, stashes, events).
    agent_name: str
    #: The session's ledger.
    ledger: Ledger
    #: The run's cancellation signal: ``cancel.on_cancel(callback)`` to stop your work.
    cancel: CancelToken = attrs.Factory(CancelToken)
    #: The run's counters and limits (chained to a parent run's).
    budget: Budget = attrs.Factory(Budget)
    #: Called with every live event when the run is observed (D7); None when nobody watches.
    emit: Callable[[Any], None] | None = None
    #: A dict for per-run state of your own (prefer ``handle.run_stash``: typed, no clashes).
    data: dict[str, Any] = attrs.Factory(dict)
    #: Resources shared by the run's steps, closed on cleanup (not the model HTTP client:
    #: that is dsh's own, kept by dsh.llm.http.client — issue 23).
    resources: dict[str, Any] = attrs.Factory(dict)
    #: Set by :meth:`stop`: the run ends after the current step.
    stop_requested: bool = False
    #: Tool calls that need approval are approved without asking (``dsh run --yes``).
    approve_all: bool = False
    #: The permission mode (``--mode``; :data:`dsh.tools.approval.MODES`): what runs without
    #: a question, what asks and what is refused.
    mode: str = "ask"
    #: Who answers an approval question the mode, ``--yes`` and grants left open, in place
    #: of the terminal: a callable taking the :class:`dsh.Ask` and returning a
    #: :class:`dsh.Decision` (an editor's permission dialog over ACP, a server that has no
    #: one to ask). None asks on the terminal. A sub-agent's run uses its parent's.
    asker: Callable[[Any], Any] | None = None
    #: Price per million tokens of the run's model, ``(input, output)``, for cost budgets.
    price: tuple[float | None, ...] | None = None
    #: The parent run, for a nested run (a sub-agent).
    parent: RunContext | None = None
    _cleanups: list[Callable[[], None]] = attrs.Factory(list)
    #: The plugins implementing ``observe_event`` in the agent's scope, as the run last saw
    #: them (at its start, then at each step boundary): an observed run delivers events to
    #: them only when there are some.
    observer_plugins: tuple[str, ...] = ()
    # A tuple, replaced (never mutated) by observe(): another thread may add an observer
    # while events are delivered.
    _observers: tuple[Callable[[Any], None], ...] = ()
    #: Run scope for plugins (``handle.run_stash``): lives as long as this run.
    stash: Stash = attrs.Factory(Stash)
    #: The :class:`dsh.run.session.Session` this run belongs to (None for a context built by hand).
    session: Session | None = attrs.field(default=None, repr=False)
    # The agent's handle (passed as ``handle=``): what ``handle.session_stash`` looks for.
    _handle: AgentHandle | None = attrs.field(default=None, repr=False)

    @property
    def handle(self) -> AgentHandle:
        """The :class:`dsh.AgentHandle` of the agent this run is for."""
        if self._handle is None:
            raise NoRunContext(f"run {self.run_id} was built without an agent handle")
        return self._handle

    @property
    def agent(self) -> str:
        """Deprecated alias of :attr:`agent_name` (removed after one minor version)."""
        deprecated_agent("RunContext")
        return self.agent_name

    def observe(self, callback: Callable[[Any], None]) -> None:
        """Receive this run's events from now on (persistent and live).

        A run started unobserved builds no events at all (D7), so observing it now would
        silently receive nothing: that warns with :class:`UnobservedRunWarning` instead.
        """
        if self.emit is None:
            warnings.warn(UnobservedRunWarning(
                f"run {self.run_id} was started unobserved, so it builds no events; pass "
                "observe=True (or on_event=) when starting it, or implement observe_event"),
                stacklevel=2)
            return
        self._observers = (*self._observers, callback)

    def notify(self, event: Any) -> None:
        """Deliver ``event`` to the observers added with :meth:`observe`."""
        for callback in self._observers:
            callback(event)

    def observer_plugins_changed(self, plugins: tuple[str, ...]) -> None:
        """The agent's ``observe_event`` plugins changed during the run (a step boundary
        noticed, D7). An observed run delivers to the new set from now on; an unobserved run
        builds no events, so a plugin added to it would receive nothing: that warns with
        :class:`UnobservedRunWarning` (once per plugin added)."""
        added = [p for p in plugins if p not in self.observer_plugins]
        self.observer_plugins = plugins
        if added and self.emit is None:
            warnings.warn(UnobservedRunWarning(
                f"observer plugin {', '.join(added)} was registered during run {self.run_id}, "
                "which was started unobserved and builds no events: it receives nothing from "
                "this run, only from the next ones"), stacklevel=3)

    @property
    def observed(self) -> bool:
        """True when the run builds live events (someone observes it, D7)."""
        return self.emit is not None

    @property
    def depth(self) -> int:
        """0 for a top-level run, 1 for a sub-agent's run, and so on."""
        return 0 if self.parent is None else self.parent.depth + 1

    @property
    def session_id(self) -> str:
        """The id of the session the run writes to."""
        return self.ledger.session_id

    def add_cleanup(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the run ends, however it ends (reverse registration order)."""
        self._cleanups.append(callback)

    def stop(self) -> None:
        """Finish the current step, then resolve normally with the output so far."""
        self.stop_requested = True

    def abort(self, reason: str = "aborted") -> None:
        """Cancel the run now: in-flight HTTP is closed and the next check raises."""
        self.cancel.cancel(reason)

    def run_cleanups(self) -> list[BaseException]:
        """Run every cleanup in reverse order; return the errors they raised (never raise)."""
        errors: list[BaseException] = []
        while self._cleanups:
            cb = self._cleanups.pop()
            try:
                cb()
            except BaseException as exc:  # noqa: BLE001 - a cleanup must not stop the others
                errors.append(exc)
        return errors


def deprecated_agent(cls: str) -> None:
    """The ``DeprecationWarning`` of ``.agent`` (a string beside ``.handle``, the object)."""
    import warnings

    warnings.warn(f"{cls}.agent is deprecated: use .agent_name (the agent's name) or .handle "
                  "(the agent)", DeprecationWarning, stacklevel=3)


def _agent_keyword(init: Callable[..., None]) -> Callable[..., None]:
    """Wrap an attrs ``__init__`` so that the old keyword ``agent=`` still sets
    ``agent_name`` (deprecated with the attribute)."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if "agent" in kwargs:
            if "agent_name" in kwargs:
                raise TypeError("pass agent_name= only (agent= is its deprecated old name)")
            kwargs["agent_name"] = kwargs.pop("agent")
        init(self, *args, **kwargs)

    __init__.__doc__ = init.__doc__
    __init__.__wrapped__ = init  # type: ignore[attr-defined]
    return __init__


RunContext.__init__ = _agent_keyword(RunContext.__init__)  # type: ignore[method-assign]


def context() -> RunContext:
    """Return the current run's :class:`RunContext`.

    :raises NoRunContext: outside a run, or in a thread started without copying the run's
        context (``contextvars.copy_context().run(fn)``).
    """
    try:
        return _current.get()
    except LookupError:
        raise NoRunContext(
            "dsh.context() called outside a run; if this is a thread or callback started by "
            "the run, start it inside contextvars.copy_context().run(...)"
        ) from None


def current_or_none() -> RunContext | None:
    return _current.get(None)


@contextmanager
def activate(ctx: RunContext) -> Iterator[RunContext]:
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)
