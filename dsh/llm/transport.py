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

The values it sends are kept by :mod:`dsh.llm.record` (what the app recorded, the run's
binding); the comparison is :mod:`dsh.llm.invariant`. This module holds what hands a request
over: :func:`send`, the adapters' ``complete`` guard, the attachment store of the request.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.core.errors import BudgetExceeded
from dsh.core.errors import InvariantViolation
from dsh.core.messages import MessageView
from dsh.core.messages import ModelRequest
from dsh.core.messages import ModelResponse
from dsh.host.runcontext import _current
from dsh.llm.invariant import _differences
from dsh.llm.invariant import check as check  # re-exported
from dsh.llm.invariant import differences as differences  # re-exported
from dsh.llm.invariant import violation
from dsh.llm.record import PROTOCOL_KEYS as PROTOCOL_KEYS  # re-exported
from dsh.llm.record import OptionLayer as OptionLayer  # re-exported
from dsh.llm.record import Record as Record  # re-exported
from dsh.llm.record import _binding
from dsh.llm.record import _bound_models
from dsh.llm.record import bind as bind  # re-exported
from dsh.llm.record import check_option_keys as check_option_keys  # re-exported
from dsh.llm.record import merge_options as merge_options  # re-exported
from dsh.llm.record import record_turn as record_turn  # re-exported
from dsh.llm.record import unbind as unbind  # re-exported

if TYPE_CHECKING:
    from dsh.llm.base import Model

TextCallback = Callable[[str], None]


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
