"""The ``pre_execute`` / ``post_execute`` layer of the tool chain (D3): :class:`HookDispatch`,
a ``trylast`` wrapper of ``execute`` registered as ``dsh.tools:HookDispatch``, and
:func:`call_pre_execute`, which calls ``pre_execute`` one implementation at a time so that a
block is attributed to the plugin that made it (docs/plugin-hooks.md, "pre_execute: the
rules")."""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

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
