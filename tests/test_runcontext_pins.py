"""Pins for dsh/host/runcontext.py found by mutation testing (docs/testing.md): exact limit
messages (a run's own limit versus a parent's), the boundaries of every limit, a time limit
measured forwards, reservations, cancellation callbacks and cleanup errors."""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.core.errors import Cancelled
from dsh.core.errors import NoRunContext
from dsh.host.runcontext import Budget
from dsh.host.runcontext import CancelToken
from dsh.host.runcontext import Limits
from dsh.host.runcontext import RunContext
from dsh.host.runcontext import UnobservedRunWarning
from dsh.host.runcontext import activate
from dsh.host.runcontext import context
from dsh.host.runcontext import current_or_none
from dsh.ledger.writer import Ledger


class Clock:
    """A hand-driven monotonic clock."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# --- messages: exact, own versus parent -------------------------------------------------

OWN_AND_PARENT = [
    (Limits(steps=2), {"steps": 2}, "steps limit reached (2/2)"),
    (Limits(requests=3), {"requests": 3}, "model requests limit reached (3/3)"),
    (Limits(tool_calls=1), {"tool_calls": 1}, "tool calls limit reached (1/1)"),
    (Limits(input_tokens=10), {"input_tokens": 10}, "input tokens limit reached (10/10)"),
    (Limits(output_tokens=5), {"output_tokens": 6}, "output tokens limit reached (6/5)"),
    (Limits(total_tokens=10), {"input_tokens": 4, "output_tokens": 6},
     "total tokens limit reached (10/10)"),
    (Limits(cost=0.5), {"cost": 0.5}, "cost limit reached (0.5000/0.5)"),
    (Limits(cost=0.25), {"cost": 1.125}, "cost limit reached (1.1250/0.25)"),
]


@pytest.mark.parametrize(("limits", "counts", "own"), OWN_AND_PARENT)
def test_a_runs_own_limit_and_a_parents_are_named_exactly(limits: Limits, counts: Any,
                                                          own: str):
    b = Budget(limits=limits)
    b.add(**counts)
    assert b.exceeded() == own
    child = Budget(parent=b)
    assert child.exceeded() == own.replace(" reached (", " reached in a parent run (")
    grandchild = Budget(parent=child)
    assert grandchild.exceeded() == child.exceeded()


def test_the_first_limit_of_the_nearest_level_is_reported():
    parent = Budget(limits=Limits(steps=1))
    child = Budget(limits=Limits(requests=1), parent=parent)
    child.add(steps=1, requests=1)
    assert child.exceeded() == "model requests limit reached (1/1)"
    assert parent.exceeded() == "steps limit reached (1/1)"
    assert (parent.steps, parent.requests) == (1, 1)  # counts go up the chain


@pytest.mark.parametrize(("limits", "counts"), [
    (Limits(steps=2), {"steps": 1}),
    (Limits(requests=3), {"requests": 2}),
    (Limits(tool_calls=1), {}),
    (Limits(input_tokens=10), {"input_tokens": 9}),
    (Limits(output_tokens=5), {"output_tokens": 4}),
    (Limits(total_tokens=10), {"input_tokens": 4, "output_tokens": 5}),
    (Limits(cost=0.5), {"cost": 0.4999}),
    (Limits(), {"steps": 10**6, "requests": 10**6, "input_tokens": 10**9, "cost": 1e9}),
])
def test_below_a_limit_nothing_is_exceeded(limits: Limits, counts: Any):
    b = Budget(limits=limits)
    b.add(**counts)
    assert b.exceeded() is None
    assert Budget(parent=b).exceeded() is None


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 50), st.integers(0, 50), st.integers(1, 60))
def test_token_limits_hold_at_exactly_the_limit(i: int, o: int, limit: int):
    for field, used in (("input_tokens", i), ("output_tokens", o), ("total_tokens", i + o)):
        b = Budget(limits=Limits(**{field: limit}))
        b.add(input_tokens=i, output_tokens=o)
        assert (b.exceeded() is not None) == (used >= limit), (field, used, limit)


# --- time -------------------------------------------------------------------------------

def test_a_generous_time_limit_lets_a_run_finish():
    clock = Clock(5000.0)
    b = Budget(limits=Limits(seconds=60), clock=clock)
    assert b.started == 5000.0
    clock.now += 59.9
    assert b.exceeded() is None
    assert Budget(parent=b).exceeded() is None
    assert b.reserve(steps=1) is None


def test_the_time_limit_is_reached_at_exactly_its_seconds():
    clock = Clock(100.0)
    b = Budget(limits=Limits(seconds=2), clock=clock)
    clock.now = 102.0
    assert b.exceeded() == "time limit reached (2.0s/2s)"
    clock.now = 103.25
    assert b.exceeded() == "time limit reached (3.2s/2s)"
    assert Budget(parent=b, clock=clock).exceeded() == (
        "time limit reached in a parent run (3.2s/2s)")
    assert b.reserve(requests=1) == "time limit reached (3.2s/2s)"


def test_the_default_clock_is_monotonic_and_starts_now():
    b = Budget(limits=Limits(seconds=3600))
    assert b.exceeded() is None
    assert Budget(limits=Limits(seconds=0)).exceeded() is not None


# --- reservations -----------------------------------------------------------------------

def test_reserve_takes_units_at_every_level_or_none():
    root = Budget(limits=Limits(requests=3))
    mid = Budget(limits=Limits(requests=10), parent=root)
    leaf = Budget(parent=mid)
    assert leaf.reserve(requests=2) is None
    assert (leaf.requests, mid.requests, root.requests) == (2, 2, 2)
    assert leaf.reserve(requests=2) == "model requests limit reached in a parent run (2/3)"
    assert (leaf.requests, mid.requests, root.requests) == (2, 2, 2)  # nothing taken
    assert leaf.reserve(requests=1) is None
    assert root.requests == 3
    assert root.reserve(requests=1) == "model requests limit reached (3/3)"


@pytest.mark.parametrize(("limit", "used", "n", "ok"), [
    (3, 0, 3, True), (3, 0, 4, False), (3, 2, 1, True), (3, 3, 0, False), (0, 0, 0, False),
    (1, 0, 1, True), (1, 1, 1, False),
])
def test_reserve_boundaries(limit: int, used: int, n: int, ok: bool):
    b = Budget(limits=Limits(tool_calls=limit))
    b.add(tool_calls=used)
    reason = b.reserve(tool_calls=n)
    assert (reason is None) == ok
    assert b.tool_calls == (used + n if ok else used)
    if not ok:
        assert reason == f"tool calls limit reached ({used}/{limit})"


def test_reserve_is_refused_once_another_limit_is_reached():
    b = Budget(limits=Limits(cost=1.0, steps=100))
    b.add(cost=1.0)
    assert b.reserve(steps=1) == "cost limit reached (1.0000/1)"
    assert b.steps == 0
    b2 = Budget(limits=Limits(output_tokens=3))
    b2.add(output_tokens=3)
    assert b2.reserve(steps=1, requests=1) == "output tokens limit reached (3/3)"


def test_reserve_is_exact_under_concurrency():
    root = Budget(limits=Limits(tool_calls=7))
    children = [Budget(parent=root) for _ in range(4)]
    granted: list[bool] = []
    start = threading.Barrier(8)

    def worker(b: Budget) -> None:
        start.wait()
        for _ in range(5):
            granted.append(b.reserve(tool_calls=1) is None)

    threads = [threading.Thread(target=worker, args=(children[i % 4],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert granted.count(True) == 7 and root.tool_calls == 7
    assert sum(c.tool_calls for c in children) == 7


def test_the_spent_limits_are_checked_when_all_are_set():
    clock = Clock(0.0)
    full = dict(input_tokens=100, output_tokens=100, total_tokens=150, cost=2.0, seconds=60)
    b = Budget(limits=Limits(**full), clock=clock)  # type: ignore[arg-type]
    assert b.exceeded() is None
    b.add(input_tokens=80, output_tokens=70)
    assert b.exceeded() == "total tokens limit reached (150/150)"
    assert b.reserve(steps=1) == "total tokens limit reached (150/150)"
    b2 = Budget(limits=Limits(**full), clock=clock)  # type: ignore[arg-type]
    clock.now = 61.0
    assert b2.exceeded() == "time limit reached (61.0s/60s)"


def test_one_lock_guards_the_whole_chain():
    root = Budget()
    child = Budget(parent=root)
    grandchild = Budget(parent=child)
    assert child._lock is root._lock and grandchild._lock is root._lock
    assert Budget()._lock is not root._lock


def test_limits_merged():
    base = Limits(steps=5, cost=1.0)
    assert base.merged(None) is base
    merged = base.merged(Limits(steps=2, seconds=3.0))
    assert merged == Limits(steps=2, cost=1.0, seconds=3.0)
    assert base.merged(Limits()) == base


# --- cancellation -----------------------------------------------------------------------

def test_a_fresh_token_is_not_cancelled():
    t = CancelToken()
    assert (t.cancelled, t.reason) == (False, "")
    t.check()
    assert t.wait(0) is False


def test_cancel_runs_callbacks_once_with_the_first_reason():
    t = CancelToken()
    seen: list[str] = []
    t.on_cancel(lambda: seen.append("a"))
    t.on_cancel(lambda: seen.append("b"))
    t.cancel("user pressed ^C")
    t.cancel("again")
    assert seen == ["a", "b"]
    assert (t.cancelled, t.reason) == (True, "user pressed ^C")
    assert t.wait(0) is True
    with pytest.raises(Cancelled) as exc:
        t.check()
    assert str(exc.value) == "run aborted: user pressed ^C"
    assert CancelToken().reason == "" and _default_reason() == "aborted"


def _default_reason() -> str:
    t = CancelToken()
    t.cancel()
    return t.reason


def test_unregister_removes_only_that_callback():
    t = CancelToken()
    seen: list[str] = []
    off_a = t.on_cancel(lambda: seen.append("a"))
    t.on_cancel(lambda: seen.append("b"))
    assert off_a() is None
    off_a()  # twice is harmless
    t.cancel()
    assert seen == ["b"]


def test_on_cancel_after_cancel_runs_at_once():
    t = CancelToken()
    t.cancel("late")
    seen: list[str] = []
    off = t.on_cancel(lambda: seen.append(t.reason))
    assert seen == ["late"]
    assert off() is None
    assert seen == ["late"]


def test_a_child_token_follows_its_parent_not_the_reverse():
    parent = CancelToken()
    child = CancelToken(parent)
    other = CancelToken(parent)
    child.cancel("child only")
    assert not parent.cancelled and not other.cancelled
    parent.cancel("shutdown")
    assert other.cancelled and other.reason == "shutdown"
    assert child.reason == "child only"


# --- the run context --------------------------------------------------------------------

def _ctx(**kw: Any) -> RunContext:
    return RunContext(run_id="r1", agent="a", ledger=Ledger("s1"), **kw)


def test_run_cleanups_run_in_reverse_and_return_every_error():
    ctx = _ctx()
    order: list[int] = []
    boom, bang = ValueError("boom"), KeyboardInterrupt()

    def fail(exc: BaseException, i: int) -> Any:
        def cb() -> None:
            order.append(i)
            raise exc
        return cb

    ctx.add_cleanup(lambda: order.append(1))
    ctx.add_cleanup(fail(boom, 2))
    ctx.add_cleanup(lambda: order.append(3))
    ctx.add_cleanup(fail(bang, 4))
    errors = ctx.run_cleanups()
    assert order == [4, 3, 2, 1]
    assert errors == [bang, boom]
    assert ctx.run_cleanups() == []  # each cleanup runs once


def test_abort_stop_depth_and_session():
    ctx = _ctx()
    assert ctx.session_id == "s1" and ctx.depth == 0 and not ctx.stop_requested
    child = RunContext(run_id="r2", agent="b", ledger=Ledger("s2"), parent=ctx)
    assert RunContext(run_id="r3", agent="c", ledger=Ledger("s3"), parent=child).depth == 2
    ctx.stop()
    assert ctx.stop_requested and not ctx.cancel.cancelled
    ctx.abort()
    assert ctx.cancel.cancelled and ctx.cancel.reason == "aborted"
    child.abort("limit")
    assert child.cancel.reason == "limit"


def test_observe_needs_an_observed_run():
    ctx = _ctx()
    assert not ctx.observed
    with pytest.warns(UnobservedRunWarning) as caught:
        ctx.observe(lambda e: None)
    assert str(caught[0].message) == (
        "run r1 was started unobserved, so it builds no events; pass observe=True (or "
        "on_event=) when starting it, or implement observe_event")
    assert _attributed_here(caught[0])
    ctx.notify("nothing")  # nobody was added
    seen: list[Any] = []
    observed = _ctx(emit=lambda e: None)
    assert observed.observed
    observed.observe(seen.append)
    observed.observe(lambda e: seen.append(("again", e)))
    observed.notify("x")
    assert seen == ["x", ("again", "x")]


def test_context_outside_a_run_and_inside():
    assert current_or_none() is None
    with pytest.raises(NoRunContext) as caught:
        context()
    assert str(caught.value) == (
        "dsh.context() called outside a run; if this is a thread or callback started by the "
        "run, start it inside contextvars.copy_context().run(...)")
    ctx = _ctx()
    with activate(ctx) as active:
        assert active is ctx and context() is ctx and current_or_none() is ctx
        inner = _ctx()
        with activate(inner):
            assert context() is inner
        assert context() is ctx
    assert current_or_none() is None


def test_a_thread_without_the_context_gets_no_run_context():
    errors: list[BaseException] = []
    with activate(_ctx()):
        def body() -> None:
            try:
                context()
            except NoRunContext as exc:
                errors.append(exc)
        t = threading.Thread(target=body)
        t.start()
        t.join()
    assert len(errors) == 1


def test_no_warning_for_an_observed_run():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _ctx(emit=lambda e: None).observe(lambda e: None)


def _attributed_here(w: warnings.WarningMessage, through: str = "func(") -> bool:
    """The warning names this file (the caller), not dsh.

    Under mutation testing (``MUTANT_UNDER_TEST`` set) two frames of mutmut's trampoline
    stand between a caller and the mutated function: ``_trampoline_wrapper`` calls
    ``trampoline``, which calls the original (``orig_func(``) or the mutant
    (``mutated_func(``). The right stacklevel then names that call in the trampoline; one
    frame more names the wrapper's call (``trampoline(*args``), which is where a warning
    meant for the caller's caller (``through="trampoline(*args"``) lands. Any other frame —
    dsh itself, the test, the wrapper where the trampoline was meant — is a wrong attribution,
    so the mutants of ``stacklevel`` are measured there too."""
    if "MUTANT_UNDER_TEST" not in os.environ:
        return w.filename == __file__
    import linecache

    trampoline = os.path.join("mutmut", "mutation", "trampoline.py")
    line = linecache.getline(w.filename, w.lineno)
    return w.filename.endswith(trampoline) and through in line


def _notice(ctx: RunContext, plugins: tuple[str, ...]) -> None:
    """Stands for the loop's step boundary, which calls observer_plugins_changed."""
    ctx.observer_plugins_changed(plugins)


def test_an_observer_plugin_added_to_an_unobserved_run_warns_once_per_plugin():
    ctx = _ctx()
    assert ctx.observer_plugins == ()
    with pytest.warns(UnobservedRunWarning) as caught:
        _notice(ctx, ("p1", "p2"))
    assert [str(w.message) for w in caught] == [
        "observer plugin p1, p2 was registered during run r1, which was started unobserved "
        "and builds no events: it receives nothing from this run, only from the next ones"]
    assert _attributed_here(caught[0], through="trampoline(*args")
    assert ctx.observer_plugins == ("p1", "p2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _notice(ctx, ("p1", "p2"))  # nothing new
        _notice(ctx, ("p2",))  # one removed
    assert ctx.observer_plugins == ("p2",)
    with pytest.warns(UnobservedRunWarning, match="observer plugin p1 was registered"):
        _notice(ctx, ("p1", "p2"))


def test_an_observer_plugin_added_to_an_observed_run_is_taken_silently():
    ctx = _ctx(emit=lambda e: None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _notice(ctx, ("p1",))
    assert ctx.observer_plugins == ("p1",)


def test_a_finished_child_run_leaves_no_callback_on_its_parents_token() -> None:
    from dsh.host.runcontext import CancelToken

    parent = CancelToken()
    for _ in range(100):
        child = CancelToken(parent)
        child.detach()
    assert parent._callbacks == []
    live = CancelToken(parent)
    parent.cancel("stop")
    assert live.cancelled and live.reason == "stop"


def test_runs_detach_from_the_callers_token(make_app) -> None:  # type: ignore[no-untyped-def]
    from dsh.host.runcontext import CancelToken

    caller = CancelToken()
    app = make_app(model="echo")
    with app.session() as s:
        for i in range(5):
            assert s.send(f"m{i}", cancel=caller).outcome == "completed"
    assert caller._callbacks == []
