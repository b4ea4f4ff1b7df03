"""When compaction runs: before a request (:func:`maybe_compact`), after a provider's
context-length error and by hand (:func:`compact_now`, :func:`compact_session`), and how the
``compact_context`` hook is called and its answer recorded."""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.core.messages import Message
from dsh.run.compaction.estimate import PLUGIN
from dsh.run.compaction.estimate import agent_window
from dsh.run.compaction.estimate import message_tokens
from dsh.run.compaction.estimate import meter_of
from dsh.run.compaction.strategies import TARGET_FRACTION
from dsh.run.compaction.strategies import Compaction
from dsh.run.compaction.strategies import CompactionRequest
from dsh.run.compaction.strategies import apply
from dsh.run.compaction.strategies import truncate

if TYPE_CHECKING:
    from dsh.host.runcontext import RunContext
    from dsh.ledger.history import Projection
    from dsh.ledger.store import Ledger
    from dsh.run.app import Agent


def is_context_error(exc: BaseException) -> bool:
    """True for a provider's "the prompt is longer than my context window" error, as the
    adapters report it (OpenAI-compatible, Anthropic, llama.cpp, the local model)."""
    from dsh.core.errors import ProviderError

    if not isinstance(exc, ProviderError) or getattr(exc, "streamed", False):
        return False  # part of the answer was shown: compacting would send it again
    if getattr(exc, "context_overflow", False):
        return True
    text = str(exc).lower()
    return "context too long" in text or "exceed context window" in text


#: How many context-length refusals of one request are compacted and retried.
MAX_REFUSALS = 4
#: Each refusal tightens the limit by this factor: the provider counted more than dsh did.
TIGHTEN = 0.7
#: Options that cap the answer's length; the request leaves that much of the window free.
OUTPUT_OPTIONS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "num_predict")


def output_reserve(proj: Projection, window: int) -> int:
    """The answer's room the next request must leave in ``window``: its ``max_tokens`` (or
    a synonym) option, at most half the window; 0 without one."""
    options = proj.options or {}
    for key in OUTPUT_OPTIONS:
        value = options.get(key)
        if type(value) is int and value > 0:
            return min(value, window // 2)
    return 0


def limit_of(window: int, reserve: int, tighten: int = 0) -> int:
    """What the prompt may hold: the window less the answer's room, tightened by
    :data:`TIGHTEN` per refusal the provider gave this request."""
    return int((window - reserve) * TIGHTEN ** tighten)


def maybe_compact(agent: Agent, ledger: Ledger, ctx: RunContext | None) -> None:
    """Before a request: compact when the next request would pass ``compact_at`` of the
    window, or not leave its answer's room. One comparison per step when nothing is due."""
    if agent.compaction == "off":
        return
    window = agent_window(agent)
    if not window:
        return
    proj = ledger.projection
    used = meter_of(ledger).used(proj)
    if used <= window * agent.compact_at and used <= limit_of(window,
                                                             output_reserve(proj, window)):
        return
    compact_now(agent, ledger, ctx, reason="threshold")


def compact_now(agent: Agent, ledger: Ledger, ctx: RunContext | None, *, reason: str,
                strategy: str | None = None, tighten: int = 0) -> Any:
    """Ask the ``compact_context`` hook for a compaction and record it if it shrinks the
    next request (:func:`record`). If the history still exceeds the limit (the window less
    the answer's room, tightened by ``tighten`` refusals), run the last resort, ``truncate``
    (recorded too). If even that is not enough and nothing could be compacted, or a message
    alone cannot fit, some part is too large by itself: :func:`too_large`. Returns the last
    event recorded, or ``None``. An observed run is told first (the live event
    ``context/compacting``)."""
    from dsh.core.errors import PluginError

    proj = ledger.projection
    meter = meter_of(ledger)
    window = agent_window(agent)
    reserve = output_reserve(proj, window) if window else 0
    limit = limit_of(window, reserve, tighten) if window else None
    request = _request(agent, ledger, ctx, reason, strategy or agent.compaction, limit,
                       reserve)
    if ctx is not None and ctx.emit is not None:  # a summary may take a while: say so now
        from dsh.run.recorder import LiveEvent

        ctx.emit(LiveEvent("context/compacting", {
            "strategy": request.strategy, "reason": reason, "tokens": request.used,
            "window": request.window}, ctx.session_id))
    result, plugin = call_compact_context(agent.pm, request)
    event = None
    if result is not None:
        if not isinstance(result, Compaction) or not (
            0 <= result.start <= result.end <= len(proj)
            and all(isinstance(m, Message) for m in result.replacement)
        ):
            raise PluginError(
                f"plugin {plugin} returned an invalid compaction from compact_context "
                f"(a Compaction with 0 <= start <= end <= {len(proj)} and Message items "
                f"expected, got {result!r:.200})", plugin=plugin, hook="compact_context")
        event = record(ledger, result, plugin, reason)
    if window and limit is not None and meter.used(proj) > limit:
        last = truncate(_request(agent, ledger, ctx, reason, "truncate", limit, reserve))
        if last is not None:
            event = record(ledger, last, PLUGIN, reason) or event
        after = meter.used(proj)
        # Some part is too large by itself when a message alone cannot fit, or when nothing
        # more could be compacted (the provider's last word, or by hand). Otherwise the
        # request goes out: the provider has the last word, and a refusal comes back here.
        if after > limit and (_hopeless(proj, limit) or (
                event is None and reason != "threshold")):
            event = too_large(agent, ledger, window, limit, after) or event
    return event


def _request(agent: Agent, ledger: Ledger, ctx: RunContext | None, reason: str,
             strategy: str, limit: int | None, reserve: int) -> CompactionRequest:
    proj = ledger.projection
    meter = meter_of(ledger)
    used = meter.used(proj)
    target = int(limit * TARGET_FRACTION) if limit else max(1, used // 2)
    return CompactionRequest(
        agent=agent, messages=proj.view(), window=agent_window(agent), used=used,
        target=target, reason=reason, strategy=strategy, projection=proj, ctx=ctx,
        meter=meter, ledger=ledger, reserve=reserve)


def _hopeless(proj: Projection, limit: int) -> bool:
    """Before a request, dsh's count is an over-estimate unless the provider's usage anchors
    it: the request is sent anyway (the provider has the last word, and its context-length
    error compacts and retries) unless some message alone cannot fit even at an optimistic
    4 characters per token."""
    return any(message_tokens(m) * 3 // 4 > limit for m in proj.view())


def call_compact_context(pm: Any, request: CompactionRequest) -> tuple[Any, str]:
    """Call ``compact_context`` as pluggy would (``wrapper=True`` implementations around the
    plain ones, which are asked in pluggy's order until one answers), keeping provenance: the
    plugin whose implementation returned the result, or the wrapper that replaced it. Recorded
    from the registration, never from what a plugin says of itself."""
    from dsh.core.errors import PluginError
    from dsh.host.manager import call_impl

    hook = "compact_context"
    order = list(reversed(pm.hook.compact_context.get_hookimpls()))
    for impl in order:
        if impl.hookwrapper:
            raise PluginError(f"plugin {impl.plugin_name}: old-style hookwrapper on {hook}; "
                              "use @hookimpl(wrapper=True)", plugin=impl.plugin_name, hook=hook)
    wrappers = []
    for impl in (i for i in order if i.wrapper):
        gen = call_impl(impl, hook, request=request)
        try:
            next(gen)
        except StopIteration:
            raise PluginError(f"plugin {impl.plugin_name}: its {hook} wrapper did not yield",
                              plugin=impl.plugin_name, hook=hook) from None
        wrappers.append((impl, gen))
    result: Any = None
    who = ""
    failure: BaseException | None = None
    try:
        for impl in (i for i in order if not i.wrapper):
            answer = call_impl(impl, hook, request=request)
            if answer is not None:
                result, who = answer, impl.plugin_name
                break
    except BaseException as exc:  # noqa: BLE001 - handed to the wrappers, as pluggy does
        failure = exc
    for impl, gen in reversed(wrappers):
        try:
            if failure is not None:
                gen.throw(failure)
            else:
                gen.send(result)
        except StopIteration as stop:
            failure = None
            if stop.value is not result:
                result, who = stop.value, impl.plugin_name
            continue
        except BaseException as exc:  # noqa: BLE001
            failure = exc
            continue
        failure = PluginError(f"plugin {impl.plugin_name}: its {hook} wrapper yielded twice",
                              plugin=impl.plugin_name, hook=hook)
    if failure is not None:
        raise failure
    return result, who


def record(ledger: Ledger, c: Compaction, plugin: str, reason: str) -> Any:
    """Record ``c`` as ``context/compacted`` if it shrinks the next request, else nothing
    (``None``). Before and after are measured alike: the meter's calibrated estimate of the
    whole request (system prompt, tool schemas, messages), never the provider's count of an
    earlier one; they are what ``tokens_before``/``tokens_after`` record."""
    from dsh.ledger.events import ContextCompacted

    proj = ledger.projection
    meter = meter_of(ledger)
    before = meter.estimate(proj)
    after = meter.estimate(proj, apply(proj.view(), c))
    if after >= before:
        return None  # no shorter: not a compaction (a summary longer than its input…)
    return ledger.append(
        ContextCompacted, start=c.start, end=c.end, messages=c.replacement,
        strategy=c.strategy, plugin=plugin, reason=reason, tokens_before=before,
        tokens_after=after, summary_session=c.summary_session)


def too_large(agent: Agent, ledger: Ledger, window: int, limit: int, used: int) -> Any:
    """Nothing brought the history under ``limit``: some part is too large by itself. The
    system prompt and tool schemas: a clear error. Some message: the largest are left out
    of the model's history (a recorded compaction, ``drop-oversized``), so the session stays
    usable; the turn fails only when the newest user message was one of them, with an error
    saying which part is too large and how big it is. Returns the event, if any."""
    from dsh.core.errors import ProviderError

    proj = ledger.projection
    meter = meter_of(ledger)
    fixed = meter.scale(meter.fixed(proj))
    room = f"{window} tokens" + (f", {limit} of them for the prompt" if limit < window else "")
    if meter.calibrated and fixed >= window:  # only the provider's count can blame them
        raise ProviderError(
            f"context too long: the system prompt and the {len(proj.tools)} tool schemas "
            f"alone are about {fixed} tokens, more than the model's context window "
            f"({room}) holds; shorten the system prompt or give the agent fewer tools "
            "(-T NAME, or [agents.NAME] tools = [...])")
    msgs = list(proj.view())
    sizes = sorted(((meter.scale(message_tokens(m)), i) for i, m in enumerate(msgs)),
                   reverse=True)
    dropped: list[int] = []
    excess = used - int(limit * TARGET_FRACTION)
    for size, i in sizes:
        if excess <= 0 or size <= limit * TARGET_FRACTION:
            break
        dropped.append(i)
        excess -= size
    if not dropped:
        newest = max((i for i, m in enumerate(msgs) if m.role == "user"), default=None)
        size = meter.scale(message_tokens(msgs[newest])) if newest is not None else 0
        raise ProviderError(
            f"context too long: the model's context window ({room}) cannot hold the system "
            f"prompt and the {len(proj.tools)} tool schemas (about {fixed} tokens) with the "
            f"newest user message (about {size} tokens) and the {len(msgs) - 1} other "
            f"messages left after compaction {agent.compaction!r} (about {used} tokens in "
            "all, by dsh's estimate); shorten the message or the system prompt, or give the "
            "agent fewer tools (-T NAME, or [agents.NAME] tools = [...])")
    start, end = min(dropped), max(dropped) + 1
    picked = set(dropped)
    replacement = tuple(
        attrs.evolve(m, content=f"[message left out: about {meter.scale(message_tokens(m))} "
                                f"tokens, larger than the model's context window of {window}]")
        if i in picked else m
        for i, m in enumerate(msgs[start:end], start))
    event = record(ledger, Compaction(start=start, end=end, replacement=replacement,
                                      strategy="drop-oversized"), PLUGIN, "oversized")
    newest = max((i for i, m in enumerate(msgs) if m.role == "user"), default=-1)
    if newest in picked:
        size = meter.scale(message_tokens(msgs[newest]))
        raise ProviderError(
            f"context too long: the newest user message is about {size} tokens, too large "
            "for the model's "
            f"context window ({room}) with the system prompt and tool schemas (about {fixed} "
            "tokens), even after compaction; it was left out of the model's history, so the "
            "session can go on with a smaller message")
    return event


def compact_session(app: Any, session_id: str, *, strategy: str | None = None,
                    agent: str | None = None) -> Any:
    """Compact a stored session now (``dsh sessions compact``): the ``compact_context``
    hook is asked with reason ``manual``; the event is returned (``None`` when no strategy
    proposed anything). The session's lock is held meanwhile, as for a run. A summary made
    here is a run of its own (with its own ledger), outside any budget but the config's."""
    name = agent or app.store.info(session_id).agent or None
    assembled = app.agent(name)
    with app.open_session(assembled, session_id) as session:
        return compact_now(assembled, session.ledger, None, reason="manual",
                           strategy=strategy)
