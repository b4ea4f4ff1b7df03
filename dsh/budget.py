"""Budget accounting as a layer of the chat and tool chains (MISSION D3, D8).

Counted units reserve their place in the run's budget chain *before* they start
(:meth:`~dsh.runcontext.Budget.reserve`), so request, step and tool-call limits are exact under
any concurrency:

* a model request reserves ``requests=1`` in the transport (``dsh.llm.transport.send``),
  just before it is sent; when the chain refuses, :class:`~dsh.errors.BudgetExceeded` is
  raised and nothing is sent. This layer adds its tokens and cost once it has resolved.
* a tool call is reserved by the driver (``dsh.loop.run_tools``, in call order, before the
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

from dsh.hookspecs import hookimpl
from dsh.runcontext import current_or_none

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
    cost = 0.0
    if ctx.price is not None:
        cost = (u.input_tokens * ctx.price[0] + u.output_tokens * ctx.price[1]) / 1e6
    ctx.budget.add(input_tokens=u.input_tokens, output_tokens=u.output_tokens, cost=cost)
    return response


@hookimpl(wrapper=True, trylast=True)
def execute(call: Any) -> Generator[None, Any, Any]:
    if reserved_call.get() is not call:
        ctx = current_or_none()
        if ctx is not None:
            refused = ctx.budget.reserve(tool_calls=1)
            if refused:
                call.block(f"not run: {refused}", "dsh.budget")
    return (yield)
