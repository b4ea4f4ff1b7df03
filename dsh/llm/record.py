"""What the app records for a session's requests, and the run's binding to it (MISSION C3).

The effective options of an agent (:func:`merge_options`: the adapter's defaults, then each
layer, every one checked for protocol keys — :data:`PROTOCOL_KEYS`, :func:`check_option_keys`);
the model id, system prompt, tool schemas and options last written on a session's
``turn/start`` lines (:class:`Record`, remembered per ledger by :func:`record_turn`, with the
private copies that are what is sent); and the binding of a run to the agent's adapter, the
ledger and that record (:func:`bind`, :func:`unbind`), which :func:`dsh.llm.transport.send`
reads to build the sealed request. Also the one ``turn/start`` field that is not a request
value: the working directory (:func:`cwd_change`).
"""

from __future__ import annotations

import contextvars
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from dsh.core.errors import ConfigError
from dsh.core.errors import InvariantViolation
from dsh.core.messages import ToolSpec
from dsh.core.messages import freeze
from dsh.core.messages import thaw

if TYPE_CHECKING:
    from dsh.host.runcontext import RunContext
    from dsh.llm.base import Model


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


def cwd_change(projection: Any) -> dict[str, str]:
    """``{"cwd": DIR}`` for the next ``turn/start`` when this process's working directory is
    not the one the session last recorded (``projection.cwd``); empty when it is, or when it
    cannot be named (deleted). Session metadata (``dsh run -c`` continues the latest session
    of the current directory): unlike :class:`Record`'s values, never part of a request."""
    import os

    try:
        cwd = os.getcwd()
    except OSError:
        return {}
    return {} if cwd == projection.cwd else {"cwd": cwd}


def _adopt(rec: Record, proj: Any) -> None:
    """The byte rule (issue 23): once the ``turn/start`` line is written, what is sent is the
    projection's values — decoded from the bytes of the ledger file — not the objects the app
    (or a plugin serving it, a ``system_prompt`` returning a ``str`` subclass) handed over.
    The private copies are kept while the projection keeps the same objects (O(1) a turn)."""
    if rec.tools is not proj.tools:
        rec.tools = proj.tools
        rec.sent_tools = _copy_tools(proj.tools)
    if rec.options is not proj.options:
        rec.options = proj.options
        rec.sent_options = _copy(proj.options)
    rec.model = proj.model
    rec.system = proj.system


def bind(ctx: RunContext, model: Model, ledger: Any, pm: Any) -> Any:
    """Bind run ``ctx`` to the agent's adapter and the session's ledger (by the app, once the
    turn is recorded, inside the run's context). Returns a token for :func:`unbind`."""
    rec = _records.get(ledger)
    if rec is None:
        raise InvariantViolation("invariant C3: bind() before the turn was recorded")
    _adopt(rec, ledger.projection)
    _bound_models.add(model)
    return _binding.set(_Binding(ctx, model, ledger, rec, pm))


def unbind(token: Any) -> None:
    """End a binding (when the run's turn ends: a nested run must not leave its binding in
    the parent's context)."""
    _binding.reset(token)
