"""When compaction runs: before a request (:func:`maybe_compact`), after a provider's
context-length error and by hand (:func:`compact_now`, :func:`compact_session`), and how the
``compact_context`` hook is called and its answer recorded."""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.core.messages import Message
from dsh.run.compaction.estimate import agent_window
from dsh.run.compaction.estimate import message_tokens
from dsh.run.compaction.estimate import meter_of
from dsh.run.compaction.strategies import TARGET_FRACTION
from dsh.run.compaction.strategies import Compaction
from dsh.run.compaction.strategies import CompactionRequest
from dsh.run.compaction.strategies import apply

if TYPE_CHECKING:
    from dsh.host.runcontext import RunContext
    from dsh.ledger.history import Projection
    from dsh.ledger.store import Ledger
    from dsh.run.app import Agent


def is_context_error(exc: BaseException) -> bool:
    """True for a provider's "the prompt is longer than my context window" error, as the
    adapters report it (OpenAI-compatible, Anthropic, llama.cpp, the local model)."""
    from dsh.core.errors import ProviderError

    if not isinstance(exc, ProviderError):
        return False
    if getattr(exc, "context_overflow", False):
        return True
    text = str(exc).lower()
    return "context too long" in text or "exceed context window" in text


def maybe_compact(agent: Agent, ledger: Ledger, ctx: RunContext | None) -> None:
    """Before a request: compact when the next request would pass ``compact_at`` of the
    window. One comparison per step when nothing is due."""
    if agent.compaction == "off":
        return
    window = agent_window(agent)
    if not window:
        return
    used = meter_of(ledger).used(ledger.projection)
    if used <= window * agent.compact_at:
        return
    compact_now(agent, ledger, ctx, reason="threshold")


def compact_now(agent: Agent, ledger: Ledger, ctx: RunContext | None, *, reason: str,
                strategy: str | None = None) -> Any:
    """Ask the ``compact_context`` hook for a compaction, record it, and return the event
    (``None`` when no strategy proposed one). Then, if the history still does not fit the
    window, leave the oversized message(s) out of the model's history (recorded too) and
    raise a clear :class:`~dsh.core.errors.ProviderError`."""
    from dsh.core.errors import PluginError

    proj = ledger.projection
    meter = meter_of(ledger)
    window = agent_window(agent)
    used = meter.used(proj)
    target = int(window * TARGET_FRACTION) if window else max(1, used // 2)
    request = CompactionRequest(
        agent=agent, messages=proj.view(), window=window, used=used, target=target,
        reason=reason, strategy=strategy or agent.compaction, projection=proj, ctx=ctx,
        meter=meter, ledger=ledger)
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
        event = _record(ledger, result, plugin, reason, used)
    if window:
        after = meter.used(proj)
        if after > window and (reason != "threshold" or _hopeless(proj, window)):
            _drop_oversized(agent, ledger, window, after)
    return event


def _hopeless(proj: Projection, window: int) -> bool:
    """Before a request, dsh's count is an over-estimate unless the provider's usage anchors
    it: the request is sent anyway (the provider has the last word, and its context-length
    error compacts and retries) unless some message alone cannot fit even at an optimistic
    4 characters per token."""
    return any(message_tokens(m) * 3 // 4 > window for m in proj.view())


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


def _record(ledger: Ledger, c: Compaction, plugin: str, reason: str, before: int) -> Any:
    from dsh.ledger.events import ContextCompacted

    proj = ledger.projection
    meter = meter_of(ledger)
    after = meter.estimate(proj, apply(proj.view(), c))
    return ledger.append(
        ContextCompacted, start=c.start, end=c.end, messages=c.replacement,
        strategy=c.strategy, plugin=plugin, reason=reason, tokens_before=before,
        tokens_after=after, summary_session=c.summary_session)


def _drop_oversized(agent: Agent, ledger: Ledger, window: int, used: int) -> None:
    """Nothing brought the history under the window: some message alone is too large. Leave
    the largest messages out of the model's history (a recorded compaction, so the session
    stays usable for the next, smaller message) and fail the turn with a clear error."""
    from dsh.core.errors import ProviderError

    proj = ledger.projection
    msgs = list(proj.view())
    sizes = sorted(((message_tokens(m), i) for i, m in enumerate(msgs)), reverse=True)
    dropped: list[int] = []
    excess = used - int(window * TARGET_FRACTION)
    for size, i in sizes:
        if excess <= 0 or size <= window * TARGET_FRACTION:
            break
        dropped.append(i)
        excess -= size
    if not dropped:
        raise ProviderError(
            f"context too long: the session's history (about {used} tokens) could not be "
            f"brought under the model's context window ({window} tokens) by compaction "
            f"{agent.compaction!r}; try `dsh sessions compact ID --strategy summarize`")
    largest = sizes[0][0]
    start, end = min(dropped), max(dropped) + 1
    picked = set(dropped)
    replacement = tuple(
        attrs.evolve(m, content=f"[message left out: about {message_tokens(m)} tokens, larger "
                                f"than the model's context window of {window}]")
        if i in picked else m
        for i, m in enumerate(msgs[start:end], start))
    _record(ledger, Compaction(start=start, end=end, replacement=replacement,
                               strategy="drop-oversized"), "dsh.compaction", "oversized", used)
    raise ProviderError(
        f"context too long: a message of about {largest} tokens is too large for the model's "
        f"context window ({window} tokens) with the rest of the conversation, even after "
        "compaction; it was left out of the model's history, so the session can go on with "
        "a smaller message")


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
