"""Budget counting as a layer of the chat and tool chains (MISSION D3, D8).

A model request counts once it has resolved with its usage; a tool call counts when it has run.
Both wrappers are ``trylast`` and registered after ``dsh.recorder``, so the layers read
plugin middleware → budget → recorder → core: a plugin wrapper sees the call already counted.
Limits are checked by the loop between units of work, so a run may overshoot by one model
call per nesting level (documented in docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from dsh.hookspecs import hookimpl
from dsh.runcontext import current_or_none


@hookimpl(wrapper=True, trylast=True)
def request(call: Any) -> Generator[None, Any, Any]:
    response = yield
    ctx = current_or_none()
    if ctx is not None:
        u = response.usage
        cost = 0.0
        if ctx.price is not None:
            cost = (u.input_tokens * ctx.price[0] + u.output_tokens * ctx.price[1]) / 1e6
        ctx.budget.add(requests=1, input_tokens=u.input_tokens, output_tokens=u.output_tokens,
                       cost=cost)
    return response


@hookimpl(wrapper=True, trylast=True)
def execute(call: Any) -> Generator[None, Any, Any]:
    outcome = yield
    ctx = current_or_none()
    if ctx is not None:
        ctx.budget.add(tool_calls=1)
    return outcome
