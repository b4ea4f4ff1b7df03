"""The system prompt (MISSION A4): fragments from many plugins, stitched in a documented order.

:func:`collect_prompt` gathers the fragments (``register_prompt``) and asks the
``system_prompt`` hook to make the text. This module is also the built-in plugin
``dsh.prompt``, whose ``system_prompt`` (``trylast``) stitches: the agent's own ``system``
text first, then every registered fragment by ascending ``order`` (default 100), ties broken
by registration order (plugins are asked in the order they were registered). Fragments are
separated by one blank line; empty fragments are skipped. ``disable = ["dsh.prompt"]`` and a
plugin's own ``system_prompt`` replaces the stitching; disabled with nothing in its place, the
prompt is the agent's own ``system`` text alone (no fragment is stitched).
"""

from __future__ import annotations

from typing import Any

import attrs

from dsh.core.errors import PluginError
from dsh.hookspecs import hookimpl
from dsh.host.manager import call_impl


@attrs.frozen
class PromptPart:
    """One fragment of the system prompt and where it came from."""

    text: str
    plugin: str
    name: str | None = None
    order: int = 100


def collect_prompt(pm: Any, agent: Any, system: str | None) -> tuple[str, tuple[PromptPart, ...]]:
    """Ask every plugin of the agent's scope for fragments; return ``(text, parts)``."""
    parts: list[PromptPart] = []
    if system:
        parts.append(PromptPart(system, "config", "system", -1_000_000))
    for impl in pm.hook.register_prompt.get_hookimpls():
        plugin = impl.plugin_name

        def register(
            text: str, *, order: int = 100, name: str | None = None, _plugin: str = plugin
        ) -> None:
            if not isinstance(text, str):
                raise PluginError(
                    f"plugin {_plugin} registered a prompt fragment that is not text "
                    f"({type(text).__name__})", plugin=_plugin, hook="register_prompt",
                )
            parts.append(PromptPart(text, _plugin, name, order))

        call_impl(impl, "register_prompt", register=register, agent=agent)
    # sorted() is stable, so equal orders keep registration order.
    ordered = tuple(sorted(parts, key=lambda p: p.order))
    # Called as a firstresult hook would be, one implementation at a time (pluggy's order),
    # so a bad answer names the plugin that gave it.
    for impl in reversed(pm.hook.system_prompt.get_hookimpls()):
        if impl.wrapper or impl.hookwrapper:
            continue
        text = call_impl(impl, "system_prompt", agent=agent, system=system or "",
                         parts=tuple(parts))
        if text is None:
            continue
        if type(text) is not str:
            who = impl.plugin_name
            raise PluginError(f"plugin {who}: system_prompt returned {type(text).__name__}, "
                              "not a str", plugin=who, hook="system_prompt")
        return text, ordered
    # dsh.prompt disabled and nothing in its place: no fragment is stitched, the agent's own
    # text is the prompt
    return (system or "").strip(), ordered


@hookimpl(trylast=True)
def system_prompt(agent: Any, system: str, parts: tuple[PromptPart, ...]) -> str:
    """The built-in stitching: by ascending ``order``, blank-line separated."""
    ordered = sorted(parts, key=lambda p: p.order)
    return "\n\n".join(p.text.strip() for p in ordered if p.text.strip())


def turn_system(agent: Any, session: Any) -> str:
    """The system prompt of the turn about to start: the agent's, then the ``turn_prompt``
    fragments (recorded state shown to the model, issue 25) by ascending ``order``. O(1)
    when no plugin of the agent implements ``turn_prompt``."""
    impls = agent.pm.hook.turn_prompt.get_hookimpls()
    if not impls:
        return str(agent.system)
    parts: list[PromptPart] = []
    for impl in impls:  # the order register_prompt asks in
        plugin = impl.plugin_name

        def register(text: str, *, order: int = 100, name: str | None = None,
                     _plugin: str = plugin) -> None:
            if not isinstance(text, str):
                raise PluginError(
                    f"plugin {_plugin} registered a turn prompt fragment that is not text "
                    f"({type(text).__name__})", plugin=_plugin, hook="turn_prompt")
            parts.append(PromptPart(text, _plugin, name, order))

        call_impl(impl, "turn_prompt", register=register, agent=agent.handle, session=session)
    extra = [p.text.strip() for p in sorted(parts, key=lambda p: p.order) if p.text.strip()]
    if not extra:
        return str(agent.system)
    return "\n\n".join([agent.system, *extra] if agent.system else extra)
