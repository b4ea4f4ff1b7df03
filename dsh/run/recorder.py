"""Live events (MISSION C2, D7): the recorder layer of the chat and tool chains.

Live events exist only while running and never land in the ledger. They are built only when
the run is observed (``RunContext.emit`` is set); otherwise every call here is one attribute
test and the chains run unrecorded.

Both wrappers are ``trylast`` and registered last of the framework's layers
(``dsh.host.manager.BUILTIN_PLUGINS``), so they are the innermost: plugin wrappers → dsh.budget →
[dsh.tools:HookDispatch] → dsh.recorder → core. ``agent/request`` and ``tools/pre-execute``
therefore describe the request and the call as every other layer left them.

An unobserved run's steps leave both out of the chain (:func:`dsh.tools.dispatch.lean_hook`):
there they would only yield.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import attrs

from dsh.hookspecs import hookimpl
from dsh.host.runcontext import current_or_none

LIVE_EVENTS = (
    "agent/pre-step",
    "agent/request",
    "llm/stream",
    "llm/reasoning",
    "llm/retry",  # built by dsh.llm.http (errors.RetryNotice), which cannot import this module
    "tools/pre-execute",
    "tools/post-execute",
    "agent/turn-stopping",
    "context/compacting",  # built by dsh.run.compaction.trigger.compact_now
)


@attrs.frozen
class LiveEvent:
    """A live event: ``type`` is one of :data:`LIVE_EVENTS`; ``data`` its payload."""

    type: str
    data: dict[str, Any] = attrs.field(factory=dict, hash=False)
    session: str = ""


def emit(type_: str, **data: Any) -> None:
    """Publish a live event if, and only if, the current run is observed."""
    ctx = current_or_none()
    if ctx is not None and ctx.emit is not None:
        ctx.emit(LiveEvent(type_, data, ctx.session_id))


@hookimpl(wrapper=True, trylast=True)
def request(call: Any) -> Generator[None, Any, Any]:
    ctx = current_or_none()
    if ctx is None or ctx.emit is None:
        return (yield)
    req = call.request
    ctx.emit(LiveEvent("agent/request", {
        "model": req.model, "messages": len(req.messages), "tools": [t.name for t in req.tools],
        "stream": req.stream,
    }, ctx.session_id))
    return (yield)


@hookimpl(wrapper=True, trylast=True)
def execute(call: Any) -> Generator[None, Any, Any]:
    ctx = current_or_none()
    if ctx is None or ctx.emit is None:
        return (yield)
    ctx.emit(LiveEvent("tools/pre-execute", {
        "call_id": call.call.id, "name": call.call.name, "arguments": call.arguments,
    }, ctx.session_id))
    outcome = yield
    ctx.emit(LiveEvent("tools/post-execute", {
        "call_id": call.call.id, "name": call.call.name, "status": outcome.status,
    }, ctx.session_id))
    return outcome
