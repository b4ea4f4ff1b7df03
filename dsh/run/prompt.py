"""The system prompt (MISSION A4): fragments from many plugins, stitched in a documented order.

Order: the agent's own ``system`` text first, then every registered fragment by ascending
``order`` (default 100), ties broken by registration order (plugins are asked in the order
they were registered). Fragments are separated by one blank line; empty fragments are skipped.
"""

from __future__ import annotations

from typing import Any

import attrs

from dsh.core.errors import PluginError
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
    text = "\n\n".join(p.text.strip() for p in ordered if p.text.strip())
    return text, ordered


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
