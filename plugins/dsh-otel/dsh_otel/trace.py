"""Spans from ledger events, following OpenTelemetry's GenAI semantic conventions.

One code path for both uses: :class:`Observer` receives the persistent events of a live run
through ``observe_event``; ``dsh otel export`` feeds the same events read back from the ledger
(:func:`feed_session`). Span times are the events' own timestamps, so a trace rebuilt from a
ledger has the shape and times of the live one.

A turn is an ``invoke_agent AGENT`` span (the root of a trace, or the child of the
``execute_tool ask_CHILD`` span that ran a sub-agent); inside it each model response is a
``chat MODEL`` span (from its step's start to the response, with the model, token usage,
cost and finish reason) and each tool call an ``execute_tool NAME`` span (its call id,
status, and an ERROR status when it failed). A compaction is an event on the turn's span.

What a span may carry follows the ledger's one declaration of content and metadata
(:data:`dsh.ledger.events.FIELD_KINDS`): metadata (ids, counts, usage, durations, statuses,
outcomes, configured names) always; content (prompts, answers, tool arguments and results,
reasons quoting an error) only with ``capture_content = true``, redacted and capped — never
in a span name. A tool name the model chose is metadata only when it names a tool registered
for the turn (``turn/start``'s ``tools``); any other name is shown as ``unknown``. Without
content, an ERROR status says only what failed (``tool call error``, ``turn error``) and
``error.type`` its kind, never the tool's output or the error's text.

Export is an OTLP/HTTP exporter behind a bounded batch processor. A collector that cannot be
reached costs at most ``timeout`` seconds once: after a failed export the next exports are
dropped for 30 s, and one ``dsh: warning:`` line says so.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanKind
from opentelemetry.trace import Status
from opentelemetry.trace import StatusCode

from dsh.core.redact import redact
from dsh.core.redact import redact_url
from dsh.hookspecs import hookimpl
from dsh.ledger.events import CONTENT
from dsh.ledger.events import METADATA
from dsh.ledger.events import AssistantMessage
from dsh.ledger.events import ContextCompacted
from dsh.ledger.events import Event
from dsh.ledger.events import StepStarted
from dsh.ledger.events import ToolCalled
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import TurnEnded
from dsh.ledger.events import TurnStarted
from dsh.ledger.events import UserMessage
from dsh.ledger.events import field_kind
from dsh.ledger.events import tool_name
from dsh_otel.settings import Settings

#: Characters of one captured content attribute at most.
CONTENT_CHARS = 8192
#: Characters of a captured unregistered tool name at most.
NAME_CHARS = 256
#: Seconds exports are dropped after one failed (a down collector is not asked again).
DOWN_SECONDS = 30.0
_FAILED_OUTCOMES = frozenset({"error", "aborted"})

Price = Callable[[str], "tuple[float | None, ...] | None"]
#: ``tools_of(session) -> names``: the tools registered for a session whose ``turn/start``
#: said "unchanged" before this observer saw one (a resumed session), or None.
ToolsOf = Callable[[str], "frozenset[str] | None"]


def _ns(ts: str) -> int:
    """An event's ISO-8601 timestamp in ns since the epoch (now, when it has none)."""
    if ts:
        try:
            return int(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1e9)
        except ValueError:
            pass
    return time.time_ns()


def _content(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                          default=str, sort_keys=True)
    return redact(text[:CONTENT_CHARS])


class _Exporter(SpanExporter):
    """The OTLP/HTTP exporter; after a failure, exports are dropped for
    :data:`DOWN_SECONDS` and one warning line goes to stderr."""

    def __init__(self, settings: Settings) -> None:
        self.endpoint = settings.traces_endpoint()
        self.inner = OTLPSpanExporter(endpoint=self.endpoint,
                                      headers=dict(settings.headers) or None,
                                      timeout=settings.timeout)
        self.down_until = 0.0
        self.failed = 0
        self.exported = 0
        self.warned = False
        for name in ("opentelemetry.exporter.otlp.proto.http",
                     "opentelemetry.exporter.otlp.proto.http.trace_exporter",
                     "opentelemetry.sdk.trace.export", "opentelemetry.sdk._shared_internal"):
            logging.getLogger(name).setLevel(logging.CRITICAL)  # our one line says it

    def export(self, spans: Any) -> SpanExportResult:
        spans = list(spans)
        if time.monotonic() < self.down_until:
            self.failed += len(spans)
            return SpanExportResult.FAILURE
        try:
            result = self.inner.export(spans)
        except Exception:  # noqa: BLE001 - export never breaks a run
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self.exported += len(spans)
            return result
        self.failed += len(spans)
        self.down_until = time.monotonic() + DOWN_SECONDS
        if not self.warned:
            self.warned = True
            sys.stderr.write(f"dsh: warning: otel: could not export spans to "
                             f"{redact_url(self.endpoint)}; spans of the next "
                             f"{DOWN_SECONDS:.0f} s are dropped\n")
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def provider_for(settings: Settings) -> tuple[TracerProvider, _Exporter]:
    """A tracer provider of its own (the global one is left alone) exporting in batches."""
    resource = Resource.create({"service.name": settings.service_name, **settings.resource})
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    exporter = _Exporter(settings)
    timeout_ms = settings.timeout * 1000
    provider.add_span_processor(BatchSpanProcessor(
        exporter, max_queue_size=settings.max_queue,
        max_export_batch_size=min(512, settings.max_queue), export_timeout_millis=timeout_ms))
    return provider, exporter


class Spans:
    """Turns ledger events into spans (see the module's docstring)."""

    def __init__(self, tracer: Any, *, price: Price | None = None,
                 capture_content: bool = False, tools_of: ToolsOf | None = None) -> None:
        self.tracer = tracer
        self.price = price
        self.capture = capture_content
        self.tools_of = tools_of
        #: Per session: the names of the tools registered for its turns (metadata).
        self.registered: dict[str, frozenset[str]] = {}
        self.turns: dict[str, Any] = {}
        self.tools: dict[tuple[str, str], Any] = {}
        self.step_start: dict[str, int] = {}
        self.model: dict[str, str] = {}
        self.agent: dict[str, str] = {}
        self.usage: dict[str, list[int | float]] = {}
        self.lock = threading.Lock()

    def feed(self, e: Event) -> None:
        with self.lock:
            self._feed(e)

    def _feed(self, e: Event) -> None:
        sid = e.session
        if isinstance(e, TurnStarted):
            self.turn_started(e)
        elif isinstance(e, StepStarted):
            self.step_start[sid] = _ns(e.ts)
        elif isinstance(e, UserMessage):
            span = self.turns.get(sid)
            if span is not None and self.captures(e, "text"):
                span.set_attribute("gen_ai.input.messages", _content(
                    [{"role": "user", "parts": [{"type": "text", "content": e.text}]}]))
        elif isinstance(e, AssistantMessage):
            self.response(e)
        elif isinstance(e, ToolCalled):
            self.tool_called(e)
        elif isinstance(e, ToolReturned):
            self.tool_returned(e)
        elif isinstance(e, ContextCompacted):
            self.compacted(e)
        elif isinstance(e, TurnEnded):
            self.turn_ended(e)

    def meta(self, e: Event, name: str) -> Any:
        """Field ``name`` of ``e``, which the ledger declares metadata (a field declared
        content is a mistake here: it would reach a span without ``capture_content``)."""
        if field_kind(type(e), name) != METADATA:
            raise AssertionError(f"{type(e).__name__}.{name} is not metadata")
        return getattr(e, name)

    def captures(self, e: Event, *names: str) -> bool:
        """Whether fields ``names`` of ``e`` (declared content) may reach a span: only with
        ``capture_content``."""
        for name in names:
            if field_kind(type(e), name) != CONTENT:
                raise AssertionError(f"{type(e).__name__}.{name} is not content")
        return self.capture

    def content(self, e: Event, name: str) -> str | None:
        """Field ``name`` of ``e`` (declared content), redacted and capped, with
        ``capture_content``; None without."""
        return _content(getattr(e, name)) if self.captures(e, name) else None

    def tool(self, e: ToolCalled | ToolReturned) -> str:
        """The tool's name as metadata: the model's name when it is a registered tool of the
        session, else ``unknown``."""
        return tool_name(e.name, self.registered.get(e.session, frozenset()))

    def _parent(self, sid: str) -> Any:
        span = self.turns.get(sid)
        return otel_trace.set_span_in_context(span) if span is not None else None

    def turn_started(self, e: TurnStarted) -> None:
        sid = e.session
        model, agent = self.meta(e, "model"), self.meta(e, "agent")
        if model:
            self.model[sid] = model
        self.agent[sid] = agent
        # the registered tools' names are metadata (the rest of ``tools`` is content)
        if e.tools is not None:
            self.registered[sid] = frozenset(t.name for t in e.tools)
        elif sid not in self.registered and self.tools_of is not None:
            known = self.tools_of(sid)
            if known is not None:
                self.registered[sid] = known
        parent = None
        if e.parent:
            span = self.tools.get((e.parent, e.parent_call or "")) or self.turns.get(e.parent)
            if span is not None:
                parent = otel_trace.set_span_in_context(span)
        old = self.turns.pop(sid, None)
        if old is not None:  # a turn that never ended (a crash): closed here
            old.end(end_time=_ns(e.ts))
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent,
            "gen_ai.conversation.id": sid, "dsh.turn": self.meta(e, "turn"),
            "openinference.span.kind": "AGENT", "session.id": sid}
        if sid in self.model:
            attrs["gen_ai.request.model"] = self.model[sid]
        if e.parent:
            attrs["dsh.parent_session"] = self.meta(e, "parent")
        self.turns[sid] = self.tracer.start_span(f"invoke_agent {agent}", context=parent,
                                                 kind=SpanKind.INTERNAL, attributes=attrs,
                                                 start_time=_ns(e.ts))
        self.usage[sid] = [0, 0, 0.0]

    def response(self, e: AssistantMessage) -> None:
        sid = e.session
        model = self.model.get(sid, "") or self.meta(e, "model") or ""
        u = self.meta(e, "usage")
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "chat", "gen_ai.request.model": model,
            "gen_ai.usage.input_tokens": u.input_tokens,
            "gen_ai.usage.output_tokens": u.output_tokens,
            "gen_ai.conversation.id": sid, "openinference.span.kind": "LLM"}
        if ":" in model:
            attrs["gen_ai.provider.name"] = model.split(":", 1)[0]
        if e.model:
            attrs["gen_ai.response.model"] = e.model
        if u.cache_read_tokens:
            attrs["gen_ai.usage.cache_read.input_tokens"] = u.cache_read_tokens
        if u.cache_write_tokens:
            attrs["gen_ai.usage.cache_creation.input_tokens"] = u.cache_write_tokens
        if e.stop_reason:
            attrs["gen_ai.response.finish_reasons"] = [self.meta(e, "stop_reason")]
        if e.tool_calls:
            attrs["dsh.tool_calls"] = len(e.tool_calls)
        price = self.price(model) if self.price is not None and model else None
        cost = 0.0
        if price is not None:
            from dsh.run.budget import request_cost

            cost = request_cost(u, price)
            attrs["dsh.cost"] = cost
        if self.captures(e, "text", "tool_calls") and (e.text or e.tool_calls):
            parts: list[dict[str, Any]] = [{"type": "text", "content": e.text}] if e.text else []
            parts += [{"type": "tool_call", "id": c.id, "name": c.name,
                       "arguments": dict(c.arguments)} for c in e.tool_calls]
            attrs["gen_ai.output.messages"] = _content([{"role": "assistant", "parts": parts}])
        end = _ns(e.ts)
        span = self.tracer.start_span(f"chat {model}", context=self._parent(sid),
                                      kind=SpanKind.CLIENT, attributes=attrs,
                                      start_time=min(self.step_start.pop(sid, end), end))
        span.end(end_time=end)
        total = self.usage.setdefault(sid, [0, 0, 0.0])
        total[0] += u.input_tokens
        total[1] += u.output_tokens
        total[2] += cost

    def tool_called(self, e: ToolCalled) -> None:
        name = self.tool(e)
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": self.meta(e, "call_id"), "gen_ai.tool.type": "function",
            "openinference.span.kind": "TOOL"}
        if e.child_session:
            attrs["dsh.child_session"] = self.meta(e, "child_session")
        arguments = self.content(e, "arguments")
        if arguments is not None:
            attrs["gen_ai.tool.call.arguments"] = arguments
            if name != e.name:  # the model's own name for a tool that does not exist
                attrs["dsh.tool.requested_name"] = redact(e.name[:NAME_CHARS])
        old = self.tools.pop((e.session, e.call_id), None)
        if old is not None:  # the same call id again (a hostile ledger): the first one ends
            old.end(end_time=_ns(e.ts))
        self.tools[(e.session, e.call_id)] = self.tracer.start_span(
            f"execute_tool {name}", context=self._parent(e.session), kind=SpanKind.INTERNAL,
            attributes=attrs, start_time=_ns(e.ts))

    def tool_returned(self, e: ToolReturned) -> None:
        span = self.tools.pop((e.session, e.call_id), None)
        if span is None:
            return
        status = self.meta(e, "status")
        span.set_attribute("dsh.tool.status", status)
        changes = getattr(e, "changes", ())
        if changes:  # counts only: a diff is content (paths and text), never an attribute
            span.set_attribute("dsh.tool.files_changed", len(changes))
            span.set_attribute("dsh.tool.lines_added", sum(c.added for c in changes))
            span.set_attribute("dsh.tool.lines_removed", sum(c.removed for c in changes))
        output = self.content(e, "output")
        if output is not None:
            span.set_attribute("gen_ai.tool.call.result", output)
        if status != "ok":
            span.set_attribute("error.type", status)
            # the output (a file's text, an error quoting it) is content
            span.set_status(Status(StatusCode.ERROR, redact(e.output[:200]) if output is not None
                                   else f"tool call {status}"))
        span.end(end_time=_ns(e.ts))

    def compacted(self, e: ContextCompacted) -> None:
        attrs: dict[str, Any] = {f"dsh.compaction.{name}": self.meta(e, name) for name in (
            "start", "end", "strategy", "reason", "tokens_before", "tokens_after")}
        attrs["dsh.compaction.messages"] = len(e.messages)  # a count: metadata
        for name in ("plugin", "summary_session"):
            if getattr(e, name):
                attrs[f"dsh.compaction.{name}"] = self.meta(e, name)
        span = self.turns.get(e.session)
        if span is not None:
            span.add_event("dsh.context.compacted", attributes=attrs, timestamp=_ns(e.ts))
            return
        # between turns (dsh sessions compact): a span of its own
        alone = self.tracer.start_span("compact_context", attributes={
            **attrs, "gen_ai.conversation.id": e.session}, start_time=_ns(e.ts))
        alone.add_event("dsh.context.compacted", attributes=attrs, timestamp=_ns(e.ts))
        alone.end(end_time=_ns(e.ts))

    def turn_ended(self, e: TurnEnded) -> None:
        sid = e.session
        end = _ns(e.ts)
        for key in [k for k in self.tools if k[0] == sid]:
            self.tools.pop(key).end(end_time=end)
        span = self.turns.pop(sid, None)
        self.step_start.pop(sid, None)
        if span is None:
            return
        inp, out, cost = self.usage.pop(sid, [0, 0, 0.0])
        span.set_attribute("gen_ai.usage.input_tokens", int(inp))
        span.set_attribute("gen_ai.usage.output_tokens", int(out))
        if self.price is not None and cost:
            span.set_attribute("dsh.cost", float(cost))
        outcome = self.meta(e, "outcome")
        span.set_attribute("dsh.outcome", outcome)
        if outcome in _FAILED_OUTCOMES:
            span.set_attribute("error.type", outcome)
            # the reason may quote an error's text (a provider's, a tool's): content
            reason = self.content(e, "reason")
            span.set_status(Status(StatusCode.ERROR, redact(e.reason[:200]) if reason is not None
                                   else f"turn {outcome}"))
        span.end(end_time=end)

    def close(self) -> None:
        """End every span still open (a run cut short), now."""
        with self.lock:
            for span in [*self.tools.values(), *self.turns.values()]:
                span.end()
            self.tools.clear()
            self.turns.clear()


class Observer:
    """The ``observe_event`` plugin registered when ``[plugins.otel] enabled = true``: one
    per process, shared by every agent's plugin manager; spans are flushed at exit."""

    def __init__(self, settings: Settings, price: Price | None = None) -> None:
        import atexit

        self.settings = settings
        self.provider, self.exporter = provider_for(settings)
        self.spans = Spans(self.provider.get_tracer("dsh"), price=price,
                           capture_content=settings.capture_content, tools_of=_tools_of_run)
        atexit.register(self.shutdown)

    @hookimpl
    def observe_event(self, event: Any) -> None:
        if isinstance(event, Event):
            try:
                self.spans.feed(event)
            except Exception as exc:  # noqa: BLE001 - observation never breaks a run
                sys.stderr.write(f"dsh: warning: otel: {type(exc).__name__}: "
                                 f"{redact(str(exc))[:200]}\n")

    def shutdown(self) -> None:
        self.spans.close()
        self.provider.shutdown()


def _tools_of_run(sid: str) -> frozenset[str] | None:
    """The tools registered for session ``sid`` when it is the current run's (the ledger's
    projection follows every ``turn/start``, those before a resume included), else None."""
    from dsh.host.runcontext import current_or_none

    ctx = current_or_none()
    ledger = getattr(ctx, "ledger", None)
    if ledger is None or getattr(ledger, "session_id", None) != sid:
        return None
    return frozenset(t.name for t in ledger.projection.tools)


def feed_session(spans: Spans, read: Callable[[str], Iterable[Event]], sid: str,
                 depth: int = 0, seen: set[str] | None = None) -> int:
    """Feed session ``sid``'s events, each sub-agent session right after the tool call that
    ran it (so it nests as it did live); return how many events were fed. A session is fed
    once (a ledger naming itself as its child is not a loop), 16 levels deep at most."""
    seen = set() if seen is None else seen
    seen.add(sid)
    n = 0
    for e in read(sid):
        spans.feed(e)
        n += 1
        child = e.child_session if isinstance(e, ToolCalled) else None
        if child and child not in seen and depth < 16:
            n += feed_session(spans, read, child, depth + 1, seen)
    return n
