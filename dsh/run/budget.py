"""Budget accounting as a layer of the chat and tool chains (MISSION D3, D8).

Counted units reserve their place in the run's budget chain *before* they start
(:meth:`~dsh.host.runcontext.Budget.reserve`), so request, step and tool-call limits are exact under
any concurrency:

* a model request reserves ``requests=1`` in the transport (``dsh.llm.transport.send``),
  just before it is sent; when the chain refuses, :class:`~dsh.core.errors.BudgetExceeded` is
  raised and nothing is sent. This layer adds its tokens and cost once it has resolved.
* a tool call is reserved by the driver (``dsh.run.loop.run_tools``, in call order, before the
  step's calls are dispatched) and marked with :data:`reserved_call`; a call that reaches this
  layer unreserved (a replacement loop) reserves here, and one refused is blocked, not run.

Tokens, cost and time are known only after a unit has run: those limits stop new units from
starting and may be overshot by the units already running (docs/execution.md, "Budgets").

The layers read plugin wrappers → dsh.budget → [dsh.tools:HookDispatch] → dsh.recorder →
core: all three are ``trylast`` wrappers, registered in that order (``BUILTIN_PLUGINS``), and
pluggy runs a later-registered ``trylast`` wrapper inside an earlier one. A plugin wrapper
therefore sees a call already counted, and can wrap every framework layer.
"""

from __future__ import annotations

import contextvars
from collections.abc import Generator
from typing import Any

import attrs

from dsh.hookspecs import hookimpl
from dsh.host.runcontext import current_or_none

#: The tool invocation whose ``tool_calls`` unit the driver has already reserved; set in the
#: context the call runs in.
reserved_call: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "dsh_reserved_call", default=None)


@hookimpl(wrapper=True, trylast=True)
def request(call: Any) -> Generator[None, Any, Any]:
    ctx = current_or_none()
    if ctx is None:
        return (yield)
    # ``requests=1`` is reserved where bytes leave, by dsh.llm.transport.send: every request
    # that is sent is counted, whoever made it, and one refused is never sent.
    response = yield
    u = response.usage
    if min(u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens) < 0:
        # a count below zero (a hostile server, a plugin adapter's bug) would give budget back
        u = attrs.evolve(u, **{k: max(0, getattr(u, k)) for k in (
            "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")})
    cost = request_cost(u, ctx.price) if ctx.price is not None else 0.0
    if u.cache_read_tokens or u.cache_write_tokens:
        ctx.budget.add(input_tokens=u.input_tokens, output_tokens=u.output_tokens, cost=cost,
                       cache_read_tokens=u.cache_read_tokens,
                       cache_write_tokens=u.cache_write_tokens)
    else:
        ctx.budget.add(input_tokens=u.input_tokens, output_tokens=u.output_tokens, cost=cost)
    return response


#: Prompt-cache prices relative to the input price, used when the price table gives only
#: ``input`` and ``output``: Anthropic's published rates (a cache read costs 0.1 of an input
#: token, a 5-minute cache write 1.25). OpenAI's automatic cache reads are cheaper than
#: input too and never written at a premium; configure ``cache_read`` for exact figures.
CACHE_READ_MULTIPLIER = 0.1
CACHE_WRITE_MULTIPLIER = 1.25


def request_cost(usage: Any, price: Any) -> float:
    """The cost of one response's usage at ``price`` per million tokens: ``(input,
    output)`` or ``(input, output, cache_read, cache_write)`` (None: the default multiple of
    the input price, :data:`CACHE_READ_MULTIPLIER` / :data:`CACHE_WRITE_MULTIPLIER`).

    ``usage.input_tokens`` includes the cached tokens; only the rest is billed at the input
    price, cache reads at the read price, cache writes at the write price.
    """
    inp, out = float(price[0]), float(price[1])
    read = price[2] if len(price) > 2 and price[2] is not None else inp * CACHE_READ_MULTIPLIER
    write = price[3] if len(price) > 3 and price[3] is not None else inp * CACHE_WRITE_MULTIPLIER
    cached_read = usage.cache_read_tokens
    cached_write = usage.cache_write_tokens
    full = max(0, usage.input_tokens - cached_read - cached_write)
    return (full * inp + cached_read * float(read) + cached_write * float(write)
            + usage.output_tokens * out) / 1e6


def model_price(model_id: str, settings: Any) -> tuple[float | None, ...] | None:
    """``(input, output, cache_read, cache_write)`` per million tokens for ``model_id``, or
    None when nothing prices it: its ``[models.ID] price`` table (``settings["price"]``)
    laid key by key over the shared price table (``dsh.core.modeldata.price_for``, when that
    module is there: the seam for it).

    A cache price nobody gives is None. With both None (only input and output known),
    :func:`request_cost` applies the default multipliers; with only ``cache_write`` None (a
    provider whose cache writes cost nothing extra), writes are billed as input.
    """
    import importlib

    configured = (settings or {}).get("price") or {}
    try:
        modeldata: Any = importlib.import_module("dsh.core.modeldata")
    except ImportError:
        modeldata = None
    if modeldata is not None:
        found = modeldata.price_for(model_id, configured)
        price = {k: getattr(found, k, None) for k in ("input", "output", "cache_read",
                                                      "cache_write")} if found else {}
    else:
        price = dict(configured)
    if not price or (price.get("input") is None and price.get("output") is None):
        return None
    read, write = price.get("cache_read"), price.get("cache_write")
    if read is not None and write is None:
        write = price.get("input")
    return (float(price.get("input") or 0), float(price.get("output") or 0),
            None if read is None else float(read), None if write is None else float(write))


@hookimpl(wrapper=True, trylast=True)
def execute(call: Any) -> Generator[None, Any, Any]:
    if reserved_call.get() is not call:
        ctx = current_or_none()
        if ctx is not None:
            refused = ctx.budget.reserve(tool_calls=1)
            if refused:
                call.block(f"not run: {refused}", "dsh.budget")
    return (yield)
