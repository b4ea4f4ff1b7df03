"""The one exit for bytes: every model request leaves dsh through :func:`send` (MISSION C3, G1).

Invariant C3 — *what the model sees is what is recorded* — is checked here, where bytes leave,
not in a hook a plugin could replace:

* **What is sent is built from the record, not taken from the caller.** Inside a run,
  :func:`send` builds the *sealed* request itself: the messages are the ledger projection's
  view; model, system prompt, tool schemas and options are the values the app wrote on this
  session's ``turn/start`` lines (kept here, out of reach of the projection's public
  attributes; tool schemas and options from private copies taken when they were recorded).
  The request that travelled through the ``request`` chain is only *compared* with it:
  identical fields (the normal path) cost five identity tests, O(1); a request some layer
  rebuilt is compared by value, and any difference fails the turn with
  :class:`~dsh.core.errors.InvariantViolation` — naming the plugin that swapped it where that can
  be known — before anything is sent. Even a comparison fooled by a hostile object could not
  smuggle bytes: the adapter is handed the sealed request, never the caller's.
* **The adapter is the recorded one.** Inside a run the adapter is the agent's, bound when the
  turn was recorded; a different adapter object (a proxy swapped onto ``call.model``) is a
  violation.
* **Adapters cannot be called around it.** :class:`~dsh.llm.base.Model` wraps every
  subclass's ``complete`` (``__init_subclass__``) so that it runs only for the request
  :func:`send` handed to that adapter, once: a plugin calling ``model.complete(...)`` itself,
  or calling it again from a streaming callback, gets an InvariantViolation and nothing is
  sent. Outside any run, :func:`send` serves standalone use (scripts, adapter tests): there is
  no session to record into, and an adapter bound to an agent is refused there.
* **Every request that leaves is counted first**: ``requests=1`` is reserved in the run's
  budget chain before sending (D8), so calling the transport twice cannot exceed the limit.
"""

from __future__ import annotations

import contextvars
import functools
import operator
import weakref
from collections.abc import Callable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.core.errors import BudgetExceeded
from dsh.core.errors import ConfigError
from dsh.core.errors import InvariantViolation
from dsh.core.messages import Attachment
from dsh.core.messages import FrozenDict
from dsh.core.messages import FrozenList
from dsh.core.messages import Message
from dsh.core.messages import MessageView
from dsh.core.messages import ModelRequest
from dsh.core.messages import ModelResponse
from dsh.core.messages import Reasoning
from dsh.core.messages import ToolCall
from dsh.core.messages import ToolSpec
from dsh.core.messages import freeze
from dsh.core.messages import thaw
from dsh.host.runcontext import _current

if TYPE_CHECKING:
    from dsh.host.runcontext import RunContext
    from dsh.llm.base import Model

TextCallback = Callable[[str], None]

#: Keys no ``options`` table may set, whatever the adapter: they are the request's own fields
#: (or a protocol's words for them), and options are merged into the wire body.
PROTOCOL_KEYS = frozenset({"messages", "model", "tools", "system", "stream", "input", "prompt"})


# -- options ----------------------------------------------------------------------------------

#: One layer of options: ``(where it comes from, the table)``.
OptionLayer = tuple[str, Mapping[str, Any]]


def check_option_keys(options: Mapping[str, Any], source: str,
                      reserved: frozenset[str] = PROTOCOL_KEYS) -> None:
    """A :class:`ConfigError` naming the first protocol key ``options`` sets, and where."""
    bad = sorted(k for k in options if k in reserved)
    if bad:
        raise ConfigError(
            f"{source}: option {bad[0]!r} cannot be set through options: it is a field of the "
            "request dsh builds from the session ledger (MISSION C3); protocol keys are "
            f"{', '.join(sorted(reserved))}")


def merge_options(model: Model, layers: list[OptionLayer]) -> Mapping[str, Any]:
    """The effective options of an agent: the adapter's defaults, then each layer in order
    (model-level, agent-level, overrides), each checked for protocol keys; frozen."""
    reserved = PROTOCOL_KEYS | model.reserved_options
    merged: dict[str, Any] = {}
    for source, options in [(f"model adapter {type(model).__name__} (defaults)",
                             model.default_options()), *layers]:
        check_option_keys(options, source, reserved)
        merged.update(options)
    return freeze(merged)


# -- what the app records ---------------------------------------------------------------------


class Record:
    """The request-level values last written on a session's ``turn/start`` lines.

    ``model``, ``system``, ``tools`` and ``options`` are the objects that were written (the
    projection holds the same ones, which keeps the check an identity test). What is *sent*
    is built from private copies of the tool schemas and options, taken when they were
    recorded: a plugin that defeats the read-only mappings it can reach
    (``dict.__setitem__(request.options, …)``) changes nothing that leaves.
    """

    __slots__ = ("model", "system", "tools", "options", "sent_tools", "sent_options")

    def __init__(self, model: str, system: str, tools: tuple[ToolSpec, ...],
                 options: Mapping[str, Any], previous: Record | None = None) -> None:
        self.model = model
        self.system = system
        self.tools = tools
        self.options = freeze(options)
        # the private copies are taken once per change, not per turn (this also keeps the
        # adapter's tool memo an identity hit)
        self.sent_tools: tuple[ToolSpec, ...]
        self.sent_options: Mapping[str, Any]
        if previous is not None and previous.tools == tools:
            self.sent_tools = previous.sent_tools
        else:
            self.sent_tools = _copy_tools(tools)
        if previous is not None and previous.options == self.options:
            self.sent_options = previous.sent_options
        else:
            self.sent_options = _copy(options)


def _copy(value: Any) -> Any:
    """A new frozen deep copy (no object shared with ``value``)."""
    return freeze(thaw(value))


def _copy_tools(tools: tuple[ToolSpec, ...]) -> tuple[ToolSpec, ...]:
    return tuple(ToolSpec(name=str(t.name), description=str(t.description),
                          parameters=_copy(t.parameters)) for t in tools)


class _Binding:
    __slots__ = ("ctx", "model", "ledger", "record", "pm")

    def __init__(self, ctx: Any, model: Model, ledger: Any, record: Record, pm: Any) -> None:
        self.ctx = ctx
        self.model = model
        self.ledger = ledger
        self.record = record
        self.pm = pm


#: Per ledger: its record. Per run (a context variable, so a run's tool threads and nothing
#: else see it): the adapter, ledger and record it was bound to. Module-private on purpose
#: (see docs/architecture.md, "The invariant (C3)", for where the line is drawn).
_records: weakref.WeakKeyDictionary[Any, Record] = weakref.WeakKeyDictionary()
_binding: contextvars.ContextVar[_Binding | None] = contextvars.ContextVar("dsh_binding",
                                                                          default=None)
_bound_models: weakref.WeakSet[Any] = weakref.WeakSet()


def record_turn(ledger: Any, *, model: str, system: str, tools: tuple[ToolSpec, ...],
                options: Mapping[str, Any]) -> dict[str, Any]:
    """The ``turn/start`` fields to write for a turn using these values: each is ``None``
    when unchanged since this session's last recorded turn. Remembers them as the values the
    transport will send (call it with the values it is about to write, then write them)."""
    previous = _records.get(ledger)
    if previous is None:  # a fresh session, or one just loaded from its file
        proj = ledger.projection
        previous = Record(proj.model, proj.system, tuple(proj.tools), proj.options)
    rec = Record(model, system, tools, options, previous)
    changed = {
        "model": None if rec.model == previous.model else rec.model,
        "system": None if rec.system == previous.system else rec.system,
        "tools": None if rec.tools == previous.tools else rec.tools,
        "options": None if rec.options == previous.options else rec.options,
    }
    # Keep the previous objects when equal, so the projection (folded from the same events)
    # and the record hold the same objects and the check stays an identity test.
    for key in ("model", "system", "tools", "options"):
        if changed[key] is None:
            setattr(rec, key, getattr(previous, key))
    _records[ledger] = rec
    return changed


def bind(ctx: RunContext, model: Model, ledger: Any, pm: Any) -> Any:
    """Bind run ``ctx`` to the agent's adapter and the session's ledger (by the app, once the
    turn is recorded, inside the run's context). Returns a token for :func:`unbind`."""
    rec = _records.get(ledger)
    if rec is None:
        raise InvariantViolation("invariant C3: bind() before the turn was recorded")
    _bound_models.add(model)
    return _binding.set(_Binding(ctx, model, ledger, rec, pm))


def unbind(token: Any) -> None:
    """End a binding (when the run's turn ends: a nested run must not leave its binding in
    the parent's context)."""
    _binding.reset(token)


# -- the check --------------------------------------------------------------------------------


#: The record types a request holds, compared field by field (every field, so a field added
#: to one of them is compared too).
_RECORDS = tuple((cls, operator.attrgetter(*[f.name for f in attrs.fields(cls)]))
                 for cls in (Message, ToolCall, ToolSpec, Reasoning, Attachment))


class _Odd(Exception):
    """A value of a type a request cannot legitimately hold: the comparison says "differs"."""


def _plain(value: Any) -> Any:
    """``value`` rebuilt from exact built-in types, for a comparison no subclass can fool:
    scalars as they are, mappings as dicts, sequences as lists, a record (message, tool call,
    tool schema, reasoning part, attachment) as its class name and fields; any other type
    raises :class:`_Odd`."""
    t = type(value)
    if value is None or t is str or t is int or t is float or t is bool:
        return value
    if t is dict or t is FrozenDict:
        return {_plain(k): _plain(v) for k, v in dict.items(value)}
    if t is list or t is FrozenList or t is tuple or t is MessageView:
        return [_plain(v) for v in value]
    for cls, fields in _RECORDS:
        if t is cls:
            return (cls.__name__, *map(_plain, fields(value)))
    raise _Odd


def differences(request: Any, expected: ModelRequest) -> list[str]:
    """What differs between ``request`` and ``expected`` (empty: the same).

    O(1) when every field is the recorded object itself; by value otherwise.
    """
    return _differences(request, expected.model, expected.system, expected.messages,
                        expected.tools, expected.options)


def _differences(request: Any, model: str, system: str, view: Any, tools: Any,
                 options: Any) -> list[str]:
    if type(request) is not ModelRequest:
        return [f"the request is a {type(request).__name__}, not a dsh ModelRequest"]
    problems = []
    msgs = request.messages
    if not (type(msgs) is MessageView and type(view) is MessageView and view.same_as(msgs)):
        if _differ(msgs, view):
            n = len(msgs) if hasattr(msgs, "__len__") else "?"
            problems.append(f"messages differ ({n} sent, {len(view)} in the ledger)")
    if request.system is not system and _differ(request.system, system):
        problems.append("system prompt differs")
    if request.tools is not tools and _differ(request.tools, tools):
        problems.append("tool schemas differ")
    if request.model is not model and _differ(request.model, model):
        problems.append(f"model differs ({request.model!r} vs {model!r} recorded)")
    if request.options is not options and _differ(request.options, options):
        problems.append("model options differ")
    return problems


def _differ(a: Any, b: Any) -> bool:
    try:
        return bool(_plain(a) != _plain(b))
    except (_Odd, AttributeError, TypeError, RecursionError):
        return True


def check(request: Any, expected: Any) -> None:
    """Raise :class:`InvariantViolation` when ``request`` is not what ``expected`` (a sealed
    request, or anything with ``view()``, ``model``, ``system``, ``tools``, ``options`` such
    as a :class:`~dsh.ledger.history.Projection`) records."""
    if expected is None:
        return
    if not isinstance(expected, ModelRequest):
        expected = ModelRequest(model=expected.model, system=expected.system,
                                messages=expected.view(), tools=expected.tools,
                                options=expected.options)
    problems = differences(request, expected)
    if problems:
        raise violation(problems)


def violation(problems: list[str], plugin: str = "") -> InvariantViolation:
    who = (f"Plugin {plugin} changed it" if plugin else "Some plugin changed it")
    return InvariantViolation(
        "invariant C3 violated: the model request is not what the session ledger records: "
        + "; ".join(problems) + f". {who} without writing it to the ledger; nothing was sent.",
        plugin=plugin,
    )


# -- sending ----------------------------------------------------------------------------------


#: The ``(adapter, request)`` the transport is handing over (single use: the adapter's guard
#: clears it), and the one an adapter is completing (lets its own ``super().complete`` in).
_ticket: contextvars.ContextVar[tuple[Any, ModelRequest] | None] = contextvars.ContextVar(
    "dsh_ticket", default=None)
_inside: contextvars.ContextVar[tuple[Any, ModelRequest] | None] = contextvars.ContextVar(
    "dsh_inside", default=None)


def guard(fn: Callable[..., ModelResponse]) -> Callable[..., ModelResponse]:
    """Wrap an adapter's ``complete``: it runs only for the request :func:`send` handed it."""
    if getattr(fn, "_dsh_transport", False):
        return fn

    # ``on_reasoning`` goes only to adapters that declare it (older ones keep working)
    takes_reasoning = _accepts(fn, "on_reasoning")

    def call(self: Any, request: ModelRequest, on_text: TextCallback | None,
             on_reasoning: TextCallback | None) -> ModelResponse:
        if takes_reasoning:
            return fn(self, request, on_text, on_reasoning=on_reasoning)
        return fn(self, request, on_text)

    @functools.wraps(fn)
    def complete(self: Any, request: ModelRequest, on_text: TextCallback | None = None,
                 on_reasoning: TextCallback | None = None) -> ModelResponse:
        inside = _inside.get()
        if inside is not None and inside[0] is self and inside[1] is request:
            # the adapter's own super().complete(...)
            return call(self, request, on_text, on_reasoning)
        ticket = _ticket.get()
        if ticket is None or ticket[0] is not self or ticket[1] is not request:
            raise InvariantViolation(
                f"model adapter {type(self).__name__}: complete() was called outside dsh's "
                "transport, so nothing was sent (MISSION C3). Requests leave through "
                "dsh.llm.transport.send(), which checks them against the session ledger; "
                "a plugin that wants to change the request must write the change to the "
                "ledger, not call the adapter itself.")
        _ticket.set(None)  # single use (send resets it when the adapter returns)
        token = _inside.set(ticket)
        try:
            return call(self, request, on_text, on_reasoning)
        finally:
            _inside.reset(token)

    complete._dsh_transport = True  # type: ignore[attr-defined]
    return complete


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` takes a keyword argument ``name`` (or any keyword, ``**kwargs``)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _outside(on_text: TextCallback) -> TextCallback:
    """``on_text`` run outside the adapter's dispatch: a callback cannot re-enter it."""

    def deliver(delta: str) -> None:
        token = _inside.set(None)
        try:
            on_text(delta)
        finally:
            _inside.reset(token)

    return deliver


def _hand_over(model: Model, request: ModelRequest, on_text: TextCallback | None,
               on_reasoning: TextCallback | None = None) -> ModelResponse:
    """Hand ``request`` to ``model`` (its class's guarded ``complete``), exactly once. Only
    :func:`send` calls this, after its checks."""
    complete: Callable[..., ModelResponse] = type(model).complete  # guard(): on_reasoning too
    if not getattr(complete, "_dsh_transport", False):
        raise InvariantViolation(
            f"model adapter {type(model).__name__}: its complete() was replaced after the "
            "class was defined and no longer goes through dsh's transport; nothing was sent")
    token = _ticket.set((model, request))
    try:
        return complete(model, request, _outside(on_text) if on_text is not None else None,
                        _outside(on_reasoning) if on_reasoning is not None else None)
    finally:
        _ticket.reset(token)


#: The blob store a request's attachments are read from (issue 17), handed over with the
#: request: the session's store inside a run, the caller's (``send(blobs=…)``) outside one.
#: Adapters read it through :func:`dsh.llm.attachments.payload`, which checks every byte against
#: the hash the ledger records: what leaves is the record plus the bytes it names (C3).
_blobs: contextvars.ContextVar[Any] = contextvars.ContextVar("dsh_blobs", default=None)


def blobs() -> Any:
    """The blob store of the request being handed over (None when there is none)."""
    return _blobs.get()


def _hand_over_with(blob_store: Any, *args: Any) -> ModelResponse:
    token = _blobs.set(blob_store)
    try:
        return _hand_over(*args)
    finally:
        _blobs.reset(token)


def send(request: ModelRequest, on_text: TextCallback | None = None, *,
         model: Model | None = None, call: Any = None,
         on_reasoning: TextCallback | None = None, blobs: Any = None) -> ModelResponse:
    """Send one request: the only way bytes reach a model (see the module docstring).

    Inside a run: ``request`` is checked against the ledger and the record, ``model`` (when
    given) must be the agent's bound adapter, ``requests=1`` is reserved, and the *sealed*
    request — rebuilt from the record — is what the adapter gets. ``call`` (the
    :class:`~dsh.llm.builtin.ModelCall`) lets a violation name the plugin that swapped the
    request or the adapter. Outside a run: ``model`` is required and must not belong to an
    agent; ``request`` is sent as it is (there is no session to record it in).
    ``on_reasoning`` receives reasoning deltas from adapters that stream them (never
    ``on_text``: reasoning is not the answer). ``blobs``: where a standalone request's
    attachments are read from (inside a run: the session's store, whatever is passed).
    """
    ctx = _current.get(None)
    binding = _binding.get()
    if binding is not None and binding.ctx is not ctx:
        raise InvariantViolation("invariant C3: a request from outside the run its adapter "
                                 "was bound to; nothing was sent")
    if binding is None:  # standalone: no session (a run context made by hand has none either)
        if model is None:
            raise InvariantViolation("transport.send outside a run needs the adapter (model=)")
        if model in _bound_models:
            raise InvariantViolation(
                f"model adapter {type(model).__name__} belongs to an agent: its requests are "
                "sent by the agent's runs (MISSION C3), not from outside a run; nothing was "
                "sent")
        if type(request) is not ModelRequest:
            raise InvariantViolation(f"transport.send: not a ModelRequest: "
                                     f"{type(request).__name__}")
        if ctx is not None:
            _reserve(ctx)
        return _hand_over_with(blobs, model, request, on_text, on_reasoning)
    adapter = binding.model
    if model is not None and model is not adapter:
        who = _changer(call, "model", binding.pm)
        raise violation([f"the adapter is not the recorded one ({type(model).__name__} "
                         f"object instead of the agent's {type(adapter).__name__})"], who)
    rec = binding.record
    ledger = ctx.ledger  # type: ignore[union-attr]
    if ledger is not binding.ledger:
        raise InvariantViolation("invariant C3: the run's ledger is not the one its turn was "
                                 "recorded in; nothing was sent")
    view = ledger.projection.view()
    msgs = request.messages if type(request) is ModelRequest else None
    if not (type(msgs) is MessageView and view.same_as(msgs)  # the normal path: identities
            and request.system is rec.system and request.tools is rec.tools
            and request.model is rec.model and request.options is rec.options):
        problems = _differences(request, rec.model, rec.system, view, rec.tools, rec.options)
        if problems:
            raise violation(problems, _changer(call, "request", binding.pm))
    refused = ctx.budget.reserve(requests=1)  # type: ignore[union-attr]
    if refused:
        raise BudgetExceeded(refused)
    # What leaves: a fresh request from the record alone (nobody else holds a reference).
    sealed = _new(ModelRequest)  # every field is already of its final type: no converters
    _set(sealed, "model", rec.model)
    _set(sealed, "system", rec.system)
    _set(sealed, "messages", view)
    _set(sealed, "tools", rec.sent_tools)
    _set(sealed, "options", rec.sent_options)
    _set(sealed, "stream", request.stream is True)
    return _hand_over_with(ledger.blobs, adapter, sealed, on_text, on_reasoning)


_new = object.__new__
_set = object.__setattr__
# The sealed request above sets every field by hand: fail at import if ModelRequest grows one.
assert [f.name for f in attrs.fields(ModelRequest)] == [
    "model", "system", "messages", "tools", "options", "stream"], "update transport.send"


def _reserve(ctx: Any) -> None:
    """Reserve ``requests=1`` in the run's budget chain before anything is sent (D8)."""
    refused = ctx.budget.reserve(requests=1)
    if refused:
        raise BudgetExceeded(refused)


def _changer(call: Any, what: str, pm: Any) -> str:
    """The plugin whose code last set ``call.<what>`` (recorded by ModelCall's setters)."""
    changes = getattr(call, "changed_by", None) or ()
    codes = [code for attr, code in reversed(changes) if attr == what]
    if not codes or pm is None:
        return ""
    return plugin_of_code(pm, codes[0])


def plugin_of_code(pm: Any, code: Any) -> str:
    """The plugin one of whose hook implementations is ``code`` or lives in its file."""
    same_file = ""
    for name in dir(pm.hook):
        caller = getattr(pm.hook, name, None)
        if caller is None or not hasattr(caller, "get_hookimpls"):
            continue
        for impl in caller.get_hookimpls():
            fcode = getattr(impl.function, "__code__", None)
            if fcode is None:
                continue
            if fcode is code:
                return str(impl.plugin_name)
            if not same_file and fcode.co_filename == code.co_filename \
                    and not impl.plugin_name.startswith("dsh."):
                same_file = str(impl.plugin_name)
    return same_file
