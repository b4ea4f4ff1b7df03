"""The ``pre_execute`` / ``post_execute`` layer of the tool chain (D3): :class:`HookDispatch`,
a ``trylast`` wrapper of ``execute`` registered as ``dsh.tools:HookDispatch``, and
:func:`call_pre_execute`, which calls ``pre_execute`` one implementation at a time so that a
block is attributed to the plugin that made it (docs/plugin-hooks.md, "pre_execute: the
rules")."""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

import pluggy

from dsh.core.errors import PluginError
from dsh.hookspecs import hookimpl
from dsh.host.manager import call_impl

if TYPE_CHECKING:
    from dsh.tools.registry import ToolInvocation


def call_pre_execute(pm: Any, call: ToolInvocation) -> None:
    """Call ``pre_execute`` one implementation at a time, in pluggy's order (``tryfirst``
    ones first, then the last registered first, ``trylast`` ones last), so that a block is
    attributed to the plugin that made it (docs/plugin-hooks.md, "pre_execute: the rules").

    Every implementation runs, also after one has blocked the call: each sees
    ``call.blocked`` / ``call.blocked_by`` (the first block) and may record its own decision;
    a later block is added to ``call.blocks`` and does not replace the first."""
    impls = pm.hook.pre_execute.get_hookimpls()
    if not impls:
        return
    try:
        for impl in reversed(impls):
            if impl.wrapper or impl.hookwrapper:
                raise PluginError(f"plugin {impl.plugin_name}: hook pre_execute cannot be "
                                  "wrapped (it is called one implementation at a time); use a "
                                  "plain implementation, or wrap execute",
                                  plugin=impl.plugin_name, hook="pre_execute")
            call._caller = impl.plugin_name
            call_impl(impl, "pre_execute", call=call)
    finally:
        call._caller = None


class HookDispatch:
    """The ``pre_execute`` / ``post_execute`` layer of the tool chain, as a wrapper (D3)."""

    def __init__(self, pm: Any) -> None:
        self.pm = pm

    @hookimpl(wrapper=True, trylast=True)  # between dsh.budget and dsh.recorder (dsh.host.manager)
    def execute(self, call: ToolInvocation) -> Any:
        # A blocked call still travels inward (a pluggy wrapper must yield exactly once);
        # the core implementation turns it into an error outcome without running the tool.
        call_pre_execute(self.pm, call)
        outcome = yield
        self.pm.hook.post_execute(call=call, outcome=outcome)
        return outcome


#: The built-in layers an unobserved run leaves out of its chains when they would do nothing
#: (see :func:`lean_hook`): the recorder (it only tests that nobody watches) and, while no
#: plugin implements ``pre_execute`` or ``post_execute``, the hook dispatch.
RECORDER = "dsh.recorder"
HOOK_DISPATCH = "dsh.tools:HookDispatch"


def lean_hook(pm: pluggy.PluginManager, name: str, *, observed: bool) -> Any:
    """Hook ``name`` of ``pm`` (``request`` or ``execute``) as a callable taking the hook's
    keyword arguments, for one step of a run.

    An observed run gets the hook itself: every layer, as before. An unobserved run gets the
    same chain without :data:`RECORDER`'s wrapper (on an unobserved run it only yields) and,
    for ``execute`` while no plugin implements ``pre_execute`` or ``post_execute``, without
    :data:`HOOK_DISPATCH`'s (it would call no implementation): what an unobserved run saves
    (D7). Which implementations run is decided at each call from the hook's current ones (a
    plugin registered during the run takes part from its next call, as with pluggy's own
    call); order, ``firstresult``, tracing and monitoring stay pluggy's (the call goes through
    the hook's ``_hookexec``). A hook replaced by something that is no plain pluggy hook
    caller (the replay's ``execute``) is returned as it is."""
    caller = getattr(pm.hook, name)
    if observed:
        return caller
    built = pm.__dict__.get(_LEAN)  # made once per manager and hook (two calls a step)
    if built is None:
        built = pm.__dict__[_LEAN] = {}
    hit = built.get(name)
    if hit is not None and hit[0] is caller:
        return hit[1]
    lean = _lean(pm, name, caller)
    built[name] = (caller, lean)
    return lean


#: Where a manager keeps :func:`lean_hook`'s callables by hook name, each with the hook
#: caller it was made for (a hook replaced since is made again).
_LEAN = "_dsh_lean_hooks"


def _lean(pm: pluggy.PluginManager, name: str, caller: Any) -> Any:
    if type(caller) is not pluggy.HookCaller or caller.spec is None:
        return caller
    # pluggy inserts and removes in place: always the current ones. Private to pluggy (1.5,
    # 1.6): a pluggy without them gets the whole chain, as an observed run does.
    impls = getattr(caller, "_hookimpls", None)
    hookexec = getattr(caller, "_hookexec", None)
    if not isinstance(impls, list) or hookexec is None:
        return caller
    firstresult = bool(caller.spec.opts.get("firstresult", False))
    if name != "execute":
        def call(**kwargs: Any) -> Any:
            return hookexec(name, [i for i in impls if i.plugin_name != RECORDER], kwargs,
                            firstresult)

        return call
    pre, post = pm.hook.pre_execute, pm.hook.post_execute

    def call_execute(**kwargs: Any) -> Any:
        skip = (RECORDER,) if pre._hookimpls or post._hookimpls else (RECORDER, HOOK_DISPATCH)
        return hookexec(name, [i for i in impls if i.plugin_name not in skip], kwargs,
                        firstresult)

    return call_execute
